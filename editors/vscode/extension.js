// The Steer extension: highlighting comes from syntaxes/steer.tmLanguage.json (no code needed);
// this starts the steerc language server, `steerc lsp` over stdio, for .steer files.
"use strict";

const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

// `${workspaceFolder}` in a setting is the first folder of the workspace (for a project's .venv).
function expand(value) {
  const folders = vscode.workspace.workspaceFolders;
  return folders && folders.length ? value.split("${workspaceFolder}").join(folders[0].uri.fsPath) : value;
}

// What to run: `steer.server.path` (default `steerc`, found on PATH) with `lsp` and `steer.server.args`.
function serverOptions(config) {
  const command = expand(config.get("server.path") || "steerc");
  const args = ["lsp", ...(config.get("server.args") || []).map(expand)];
  return { command, args };
}

async function activate(context) {
  const config = vscode.workspace.getConfiguration("steer");
  const server = serverOptions(config);
  const clientOptions = {
    documentSelector: [
      { scheme: "file", language: "steer" },
      { scheme: "untitled", language: "steer" },
    ],
    // No `synchronize`: the server asks for the file events it needs (client/registerCapability).
  };
  client = new LanguageClient("steer", "Steer (steerc lsp)", server, clientOptions);
  try {
    await client.start();
  } catch (err) {
    vscode.window.showErrorMessage(
      `Steer: could not start \`${server.command} lsp\` (${err && err.message ? err.message : err}). ` +
        "Install steerc, or set steer.server.path to its full path; highlighting works without it."
    );
  }
  context.subscriptions.push({ dispose: () => (client ? client.stop() : undefined) });
  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (event.affectsConfiguration("steer.server")) {
        vscode.window.showInformationMessage("Steer: reload the window to restart the language server.");
      }
    })
  );
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate, serverOptions };
