"""The VS Code extension under ``editors/vscode``: its manifest, language configuration and client.

The manifest must be what VS Code reads (contributes a ``steer`` language
for ``*.steer`` with its configuration and the ``source.steer`` grammar,
activates on ``onLanguage:steer``, starts from ``extension.js``), and
``extension.js`` must start ``steerc lsp`` (or ``steer.server.path``) over
stdio: that is checked by running its ``activate()`` under Node.js against
stand-ins for the ``vscode`` API and the language client
(``editors/vscode/test/activate.js``); those tests skip without Node.js.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VSCODE = os.path.join(REPO, "editors", "vscode")


def load(name: str) -> dict:
    with open(os.path.join(VSCODE, name), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def manifest() -> dict:
    return load("package.json")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.match(r"\^?(\d+)\.(\d+)\.(\d+)", text).groups())


def test_manifest_fields(manifest):
    for key in ("name", "displayName", "description", "version", "publisher", "main"):
        assert isinstance(manifest[key], str) and manifest[key], key
    assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", manifest["name"])
    assert re.fullmatch(r"\^1\.\d+\.\d+", manifest["engines"]["vscode"])
    assert os.path.isfile(os.path.join(VSCODE, manifest["main"]))
    assert "onLanguage:steer" in manifest["activationEvents"]
    assert "Programming Languages" in manifest["categories"]
    assert "vscode-languageclient" in manifest["dependencies"]
    assert {"vscode-textmate", "vscode-oniguruma"} <= set(manifest["devDependencies"])


def test_the_language_and_its_grammar(manifest):
    (language,) = manifest["contributes"]["languages"]
    assert language["id"] == "steer" and language["extensions"] == [".steer"]
    assert "Steer" in language["aliases"]
    assert re.match(language["firstLine"], "steer 1")
    config_path = os.path.join(VSCODE, language["configuration"])
    assert os.path.isfile(config_path)
    (grammar,) = manifest["contributes"]["grammars"]
    assert grammar["language"] == "steer"
    with open(os.path.join(VSCODE, grammar["path"]), encoding="utf-8") as fh:
        assert json.load(fh)["scopeName"] == grammar["scopeName"] == "source.steer"


def test_the_server_settings(manifest):
    props = manifest["contributes"]["configuration"]["properties"]
    path = props["steer.server.path"]
    assert path["type"] == "string" and path["default"] == "steerc"
    assert props["steer.server.args"]["type"] == "array"
    assert props["steer.trace.server"]["enum"] == ["off", "messages", "verbose"]  # the client's trace setting


def test_language_configuration():
    config = load("language-configuration.json")
    assert config["comments"] == {"lineComment": "#"}
    assert sorted(map(tuple, config["brackets"])) == [("(", ")"), ("[", "]"), ("{", "}")]
    pairs = {(p["open"], p["close"]) for p in config["autoClosingPairs"]}
    assert {("{", "}"), ("[", "]"), ("(", ")"), ('"', '"')} <= pairs
    quote = next(p for p in config["autoClosingPairs"] if p["open"] == '"')
    assert set(quote["notIn"]) == {"string", "comment"}
    words = re.compile(config["wordPattern"])
    assert words.fullmatch("resid_post") and words.fullmatch("50%") and not words.fullmatch("a b")
    increase = re.compile(config["indentationRules"]["increaseIndentPattern"])
    assert increase.match("intervention x {") and increase.match("model {  # facts")
    assert not increase.match("intervention x { at resid_pre[0] }")
    assert re.compile(config["indentationRules"]["decreaseIndentPattern"]).match("  }")


def test_no_node_modules_or_lockfile_in_git():
    tracked = subprocess.run(["git", "ls-files", "editors"], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert tracked, "editors/ is not in git"
    assert not [p for p in tracked if "node_modules/" in p or p.endswith(("package-lock.json", "yarn.lock", ".vsix"))]
    ignored = subprocess.run(["git", "check-ignore", "-q", "editors/vscode/node_modules/x"], cwd=REPO)
    assert ignored.returncode == 0, "node_modules is not ignored"


def test_the_engine_is_one_the_language_client_supports(manifest):
    client = os.path.join(VSCODE, "node_modules", "vscode-languageclient", "package.json")
    if not os.path.isfile(client):
        pytest.skip("vscode-languageclient is not installed: run `npm install` in editors/vscode")
    with open(client, encoding="utf-8") as fh:
        needs = json.load(fh)["engines"]["vscode"]
    assert _version(manifest["engines"]["vscode"]) >= _version(needs)
    with open(os.path.join(os.path.dirname(client), "lib", "node", "main.d.ts"), encoding="utf-8") as fh:
        api = fh.read()
    # extension.js passes an Executable ({command, args}; stdio when no transport is named).
    assert ("constructor(id: string, name: string, serverOptions: ServerOptions, "
            "clientOptions: LanguageClientOptions") in api
    assert re.search(r"interface Executable \{[^}]*command: string;[^}]*args\?: string\[\];", api)


# -------------------------------------------------------------- the client


@pytest.fixture(scope="module")
def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.skip("Node.js is not installed: extension.js is not run")
    return path


def activate(node: str, settings: dict, mode: str = "") -> dict:
    proc = subprocess.run([node, os.path.join(VSCODE, "test", "activate.js"), json.dumps(settings), mode],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_extension_js_parses(node):
    proc = subprocess.run([node, "--check", os.path.join(VSCODE, "extension.js")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_it_starts_steerc_lsp(node):
    seen = activate(node, {})
    assert seen["server"] == {"command": "steerc", "args": ["lsp"]}  # an Executable: stdio
    assert seen["started"] and seen["stopped"] and not seen["messages"]
    assert {"scheme": "file", "language": "steer"} in seen["documentSelector"]
    assert seen["id"] == "steer"  # so `steer.trace.server` is the client's trace setting


def test_it_runs_the_configured_server(node):
    seen = activate(node, {"server.path": "/opt/project/.venv/bin/steerc", "server.args": ["--log", "x"]})
    assert seen["server"] == {"command": "/opt/project/.venv/bin/steerc", "args": ["lsp", "--log", "x"]}


def test_workspace_folder_in_the_settings(node):
    seen = activate(node, {"server.path": "${workspaceFolder}/.venv/bin/steerc", "workspaceFolder": "/home/me/proj"})
    assert seen["server"]["command"] == "/home/me/proj/.venv/bin/steerc"


def test_it_says_when_steerc_cannot_start(node):
    seen = activate(node, {}, "fail")
    ((kind, message),) = seen["messages"]
    assert kind == "error" and "steerc lsp" in message and "steer.server.path" in message
