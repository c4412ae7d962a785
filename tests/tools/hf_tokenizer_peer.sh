#!/usr/bin/env bash
# hf_tokenizer_peer.sh NODE_PREFIX TOKENIZER_JSON
# Runs hf_tokenizer_peer.js with Hugging Face's tokenizers (npm package
# @anush008/tokenizers, installed into NODE_PREFIX on first use). Exit 77
# (ctest: skipped, with the reason) when Node.js/npm or the package is not
# available: the peer is optional, the test of wlb4d's own file is not
# (hf_export_check.py checks the vocabulary against GPT-2's alphabet).
set -u
prefix=$1 tok=$2
command -v node > /dev/null || { echo "skipped: node is not installed"; exit 77; }
if [ ! -d "$prefix/node_modules/@anush008/tokenizers" ]; then
  command -v npm > /dev/null || { echo "skipped: npm is not installed"; exit 77; }
  mkdir -p "$prefix"
  timeout 300 npm install --silent --no-audit --no-fund --prefix "$prefix" @anush008/tokenizers@0.6.0 > "$prefix/npm.log" 2>&1 \
    || { echo "skipped: npm install @anush008/tokenizers failed (no registry?):"; tail -5 "$prefix/npm.log"; exit 77; }
fi
[ -f "$tok" ] || { echo "hf_tokenizer_peer: $tok is missing (the export fixture did not run)"; exit 1; }
NODE_PATH="$prefix/node_modules" exec node "$(dirname "$0")/hf_tokenizer_peer.js" "$tok"
