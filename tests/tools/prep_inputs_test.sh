#!/usr/bin/env bash
# prep_inputs_test.sh WLB4D_PREP: wlb4d-prep's input rules through the
# executable: --json-keys (which JSONL fields, in order), --txt-split
# (file | blank-line | line), --sft (the loss-mask summary line), and every
# error said once, with one "wlb4d-prep: error:" prefix and a non-zero exit.
set -u
source "$(dirname "$0")/lib.sh"
prep=$(realpath "$1")
scratch_dir prep_inputs

# prep_ok EXPECTED_REGEX ARGS...: succeeds and prints a line matching the regex.
prep_ok() {
  local want=$1; shift
  out=$("$prep" "$@" 2>&1) || fail "wlb4d-prep $* failed: $out"
  printf '%s\n' "$out" | grep -Eq -- "$want" || fail "wlb4d-prep $*: no line matches '$want' in: $out"
}
# prep_err EXPECTED_REGEX ARGS...: fails with exactly one line, one prefix, matching the regex.
prep_err() {
  local want=$1; shift
  out=$("$prep" "$@" 2>&1) && fail "wlb4d-prep $* succeeded, expected an error"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "wlb4d-prep $*: expected one line, got: $out"
  printf '%s\n' "$out" | grep -Eq -- "^wlb4d-prep: error: " || fail "no 'wlb4d-prep: error: ' prefix: $out"
  [ "$(printf '%s\n' "$out" | grep -o 'wlb4d-prep:' | wc -l)" -eq 1 ] || fail "prefix said twice: $out"
  printf '%s\n' "$out" | grep -Eq -- "$want" || fail "wlb4d-prep $*: '$want' not in: $out"
}

printf '%s\n' '{"title": "T1", "body": "B1 body", "text": "ignored"}' '{"body": "B2"}' '{"text": "only text"}' \
  '{"title": 7, "body": "B4"}' > keys.jsonl
prep_ok 'read 4 documents .*1 without "title"/"body"' --input keys.jsonl --output keys.h5 --json-keys title,body
prep_ok 'keys.h5: 4 documents, 17 tokens' --input keys.jsonl --output keys.h5 --json-keys title,body
prep_ok 'read 2 documents .*2 without "text"' --input keys.jsonl --output text.h5

printf 'First para\nline two\n\n \t\nSecond para\n\n\nThird\n' > split.txt
prep_ok 'read 1 documents' --input split.txt --output split-file.h5
prep_ok 'read 3 documents' --input split.txt --output split-para.h5 --txt-split blank-line
prep_ok 'split-para.h5: 3 documents, 38 tokens' --input split.txt --output split-para.h5 --txt-split blank-line
prep_ok 'read 4 documents' --input split.txt --output split-line.h5 --txt-split line

printf '%s\n' '{"prompt": "Q: 1+1?\nA: ", "response": "2"}' \
  '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}' > sft.jsonl
prep_ok 'read 2 fine-tuning records' --sft --input sft.jsonl --output sft.h5
prep_ok 'train loss mask: 6 of [0-9]+ targets trained' --sft --input sft.jsonl --output sft.h5
printf '%s\n' '{"instruction": "Do", "output": "done"}' > alpaca.jsonl
prep_ok 'train loss mask: 5 of' --sft --json-keys instruction,output --input alpaca.jsonl --output alpaca.h5

printf '%s\n' '{"prompt": "ok", "response": "ok"}' '{"prompt": "no response here"}' > noresp.jsonl
prep_err 'noresp.jsonl:2: fine-tuning record without a response' --sft --input noresp.jsonl --output x.h5
[ -e x.h5 ] && fail "a failed prep left x.h5"
: > empty.jsonl
prep_err 'no fine-tuning records in the input' --sft --input empty.jsonl --output x.h5
prep_err "--seed '-1' must be an unsigned integer" --input keys.jsonl --output x.h5 --seed -1
prep_err "--txt-split 'para' must be file, blank-line or line" --input split.txt --output x.h5 --txt-split para
prep_err "--json-keys 'a,,b' holds an empty field name" --input keys.jsonl --output x.h5 --json-keys a,,b
prep_err "--json-keys with --sft names the PROMPT,RESPONSE fields: exactly 2" --sft --json-keys a --input sft.jsonl --output x.h5
prep_err "fine-tuning \(--sft\) reads JSONL records only" --sft --input split.txt --output x.h5
prep_err 'no/such.jsonl: input does not exist' --input no/such.jsonl --output x.h5
prep_err 'unrecognised option|unrecognized option' --no-such-option
echo "$test_label: ok"
