// Tokenize Steer texts with the real engine VS Code uses (vscode-textmate on vscode-oniguruma).
//
//   node test/tokenize.js GRAMMAR < {"texts": ["steer 1\n...", ...]}
//     prints {"regexErrors": [...], "results": [[[[start, end, [scopes...]], ...] per line] per text]}
//     (offsets are UTF-16 code units within each line; a line's "\r" is dropped, as VS Code does)
//   node test/tokenize.js --self-test
//     tokenizes a small program with syntaxes/steer.tmLanguage.json and checks a few scopes
//
// tests/test_highlight_textmate.py runs it; `npm install` in this folder brings the two packages.
"use strict";

const fs = require("fs");
const path = require("path");
const vsctm = require("vscode-textmate");
const oniguruma = require("vscode-oniguruma");

async function loadOniguruma() {
  const wasm = fs.readFileSync(path.join(path.dirname(require.resolve("vscode-oniguruma")), "onig.wasm"));
  await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
  return {
    createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
    createOnigString: (s) => new oniguruma.OnigString(s),
  };
}

// Every regex of the grammar, compiled on its own, so that one that fails is named
// (the engine would only fail when it first reached the rule).
function regexErrors(raw) {
  const errors = [];
  const walk = (node, where) => {
    if (Array.isArray(node)) {
      node.forEach((item, i) => walk(item, `${where}[${i}]`));
    } else if (node && typeof node === "object") {
      for (const [key, value] of Object.entries(node)) {
        if (["match", "begin", "end", "while"].includes(key) && typeof value === "string") {
          try {
            new oniguruma.OnigScanner([value]).dispose();
          } catch (err) {
            errors.push(`${where}.${key}: ${value}: ${err.message || err}`);
          }
        } else {
          walk(value, `${where}.${key}`);
        }
      }
    }
  };
  walk(raw, "grammar");
  return errors;
}

async function tokenizer(grammarPath) {
  const onigLib = loadOniguruma();
  const text = fs.readFileSync(grammarPath, "utf8");
  const registry = new vsctm.Registry({
    onigLib,
    loadGrammar: async (scopeName) =>
      scopeName === "source.steer" ? vsctm.parseRawGrammar(text, grammarPath) : null,
  });
  const grammar = await registry.loadGrammar("source.steer");
  await onigLib;
  const tokenize = (source) => {
    let stack = vsctm.INITIAL;
    return source.split("\n").map((line) => {
      const result = grammar.tokenizeLine(line.endsWith("\r") ? line.slice(0, -1) : line, stack);
      stack = result.ruleStack;
      return result.tokens.map((t) => [t.startIndex, t.endIndex, t.scopes]);
    });
  };
  return { tokenize, regexErrors: regexErrors(JSON.parse(text)) };
}

async function selfTest() {
  const { tokenize, regexErrors: errors } = await tokenizer(path.join(__dirname, "..", "syntaxes", "steer.tmLanguage.json"));
  if (errors.length) throw new Error(errors.join("\n"));
  const lines = tokenize('steer 1\nvector v = load("a.npy")  # c\nintervention i {\n  at resid_post[1]\n  add 2 * v\n}\n');
  const scopeOf = (line, text) => {
    const source = ['steer 1', 'vector v = load("a.npy")  # c', "intervention i {", "  at resid_post[1]", "  add 2 * v"][line];
    const at = source.indexOf(text);
    const token = lines[line].find((t) => t[0] <= at && at < t[1]);
    return token[2];
  };
  const expect = [
    [0, "steer", "keyword.control.directive.steer"],
    [1, "vector", "storage.type.steer"],
    [1, "load", "support.function.builtin.steer"],
    [1, "a.npy", "string.quoted.double.steer"],
    [1, "# c", "comment.line.number-sign.steer"],
    [3, "at", "keyword.control.steer"],
    [3, "resid_post", "support.type.site.steer"],
    [4, "2", "constant.numeric.integer.steer"],
  ];
  for (const [line, text, scope] of expect) {
    const got = scopeOf(line, text);
    if (!got.includes(scope)) throw new Error(`${text}: ${got.join(" ")}, not ${scope}`);
  }
  console.log(`ok: ${expect.length} scopes`);
}

async function main() {
  if (process.argv[2] === "--self-test") return selfTest();
  const { tokenize, regexErrors: errors } = await tokenizer(process.argv[2]);
  const input = JSON.parse(fs.readFileSync(0, "utf8"));
  process.stdout.write(JSON.stringify({ regexErrors: errors, results: input.texts.map(tokenize) }));
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
