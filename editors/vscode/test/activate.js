// Runs extension.js's activate() against stand-ins for `vscode` and `vscode-languageclient/node`,
// and prints what it did as JSON: the server it would start, the client's options, any message.
//
//   node test/activate.js '{"server.path": "/opt/steerc", "server.args": ["--x"]}' [fail]
//
// With `fail`, the client's start() rejects (steerc missing), and the extension must say so.
"use strict";

const Module = require("module");
const path = require("path");

const settings = JSON.parse(process.argv[2] || "{}");
const mode = process.argv[3] || "";
const seen = { messages: [], started: false, subscriptions: 0 };

const folder = settings.workspaceFolder;  // not a setting: the workspace's first folder, if any
const vscode = {
  workspace: {
    workspaceFolders: folder ? [{ uri: { fsPath: folder } }] : undefined,
    getConfiguration: (section) => ({ get: (key, fallback) => (key in settings ? settings[key] : fallback) }),
    createFileSystemWatcher: (glob) => ({ glob, dispose() {} }),
    onDidChangeConfiguration: () => ({ dispose() {} }),
  },
  window: {
    showErrorMessage: (m) => seen.messages.push(["error", m]),
    showInformationMessage: (m) => seen.messages.push(["info", m]),
  },
};

class LanguageClient {
  constructor(id, name, server, client) {
    Object.assign(seen, { id, name, server, documentSelector: client.documentSelector });
    seen.watches = client.synchronize && client.synchronize.fileEvents ? client.synchronize.fileEvents.glob : null;
  }
  start() {
    seen.started = true;
    return mode === "fail" ? Promise.reject(new Error("spawn steerc ENOENT")) : Promise.resolve();
  }
  stop() {
    seen.stopped = true;
    return Promise.resolve();
  }
}

const load = Module._load;
Module._load = function (request, parent, isMain) {
  if (request === "vscode") return vscode;
  if (request === "vscode-languageclient/node") return { LanguageClient };
  return load.call(this, request, parent, isMain);
};

async function main() {
  const extension = require(path.join(__dirname, "..", "extension.js"));
  const context = { subscriptions: { push: (...items) => (seen.subscriptions += items.length) } };
  await extension.activate(context);
  await extension.deactivate();
  console.log(JSON.stringify(seen));
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
