#!/usr/bin/env bash
# hf_bpe_peer.sh NODE_PREFIX HF_BPE_ENCODE SOURCE_DIR WORKDIR
# wlb4d's byte-level BPE against independent peers on GPT-2's and Llama 3's
# real vocabularies (hf_bpe_peer.js): Hugging Face's tokenizers (npm
# @anush008/tokenizers) loads the same tokenizer.json, and each vocabulary's
# own JavaScript encoder (gpt-3-encoder, llama3-tokenizer-js) encodes without
# one. Texts: tests/data/tiny.jsonl, the embedded SOTU corpus (47 addresses,
# 2.3 MB), a Unicode stress text, and long runs (whitespace, a 200 KB word,
# digits; HF only). The npm packages are installed into
# NODE_PREFIX on first use; exit 77 (ctest: skipped, with the reason) when
# Node.js/npm or the registry is not available.
set -u
prefix=$1 encode=$2 src=$3 work=$4
test_label=hf_bpe_peer
fail() { echo "$test_label: $*"; exit 1; }
command -v node > /dev/null || { echo "skipped: node is not installed"; exit 77; }
pkgs=(@anush008/tokenizers@0.6.0 gpt-3-encoder@1.1.4 llama3-tokenizer-js@1.2.0)
if [ ! -d "$prefix/node_modules/@anush008/tokenizers" ] || [ ! -d "$prefix/node_modules/gpt-3-encoder" ] ||
   [ ! -d "$prefix/node_modules/llama3-tokenizer-js" ]; then
  command -v npm > /dev/null || { echo "skipped: npm is not installed"; exit 77; }
  mkdir -p "$prefix"
  timeout 300 npm install --silent --no-audit --no-fund --prefix "$prefix" "${pkgs[@]}" > "$prefix/npm.log" 2>&1 \
    || { echo "skipped: npm install ${pkgs[*]} failed (no registry?):"; tail -5 "$prefix/npm.log"; exit 77; }
fi
command -v xz > /dev/null || fail "xz is not installed (needed to read the SOTU corpus)"
rm -rf "$work" && mkdir -p "$work" || fail "cannot make $work"
peer() { NODE_PATH="$prefix/node_modules" node "$(dirname "$0")/hf_bpe_peer.js" "$@"; }
peer build "$work" || fail "building the tokenizer.json files failed"
cp "$src/tests/data/tiny.jsonl" "$work/tiny.jsonl" || fail "no tests/data/tiny.jsonl"
xz -dc "$src/inputs/corpus/sotu-embedded.jsonl.xz" > "$work/sotu.jsonl" || fail "cannot read the SOTU corpus"
for tok in gpt2 llama3; do
  for texts in tiny sotu stress long; do
    own=--own
    [ "$texts" = long ] && own=  # the JavaScript encoders are quadratic in a word's length
    "$encode" "$work/$tok.json" "$work/$texts.jsonl" > "$work/$tok.$texts.ids" \
      || fail "$tok $texts: hf_bpe_encode failed (a text does not round-trip, or the tokenizer.json is refused)"
    peer compare "$tok" "$work/$tok.json" "$work/$texts.jsonl" "$work/$tok.$texts.ids" $own \
      || fail "$tok $texts: wlb4d differs from a peer (above)"
  done
done
"$encode" "$work/gpt2.json" "$work/sotu.jsonl" --bench 3 || fail "the throughput pass failed"
echo "$test_label: ok"
