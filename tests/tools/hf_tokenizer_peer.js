// Hugging Face's tokenizers library (the Rust crate, through its Node.js
// binding @anush008/tokenizers) reads the tokenizer.json that
// `wlb4d-ckpt export-hf` writes for the bytes tokenizer: every string encodes
// to its UTF-8 bytes (wlb4d's ids, computed here with Buffer), decodes back,
// and the EOS text is the special token 256.
//   node hf_tokenizer_peer.js TOKENIZER_JSON
const { Tokenizer } = require("@anush008/tokenizers");
const t = Tokenizer.fromFile(process.argv[2]);
const texts = [
  "Fellow-Citizens of the Senate", "héllo wörld — ünïcode ✓ 中文 🙂", "tabs\tand\nnewlines\r\n", "  leading spaces",
  "\u0000\u0001\u001f control", "~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./", "", "ÿ¡¬®",
];
let all = "";
for (let b = 0; b < 128; ++b) all += String.fromCharCode(b);
texts.push(all);
(async () => {
  let failures = 0;
  for (const text of texts) {
    const want = Array.from(Buffer.from(text, "utf8"));
    const enc = await t.encode(text, null, { addSpecialTokens: false });
    const ids = Array.from(enc.getIds());
    const back = await t.decode(ids, false);
    if (JSON.stringify(ids) !== JSON.stringify(want)) {
      console.log(`encode(${JSON.stringify(text)}) = ${ids} but the UTF-8 bytes are ${want}`);
      ++failures;
    }
    if (back !== text) {
      console.log(`decode(encode(${JSON.stringify(text)})) = ${JSON.stringify(back)}`);
      ++failures;
    }
  }
  const eos = Array.from((await t.encode("a</s>", null, { addSpecialTokens: false })).getIds());
  if (JSON.stringify(eos) !== JSON.stringify([97, 256])) {
    console.log(`encode("a</s>") = ${eos}, expected [97, 256] (EOS is the added special token 256)`);
    ++failures;
  }
  if (failures) process.exit(1);
  console.log(`hf_tokenizer_peer: ok (${texts.length} strings round-trip through HF tokenizers as their bytes; EOS 256)`);
})();
