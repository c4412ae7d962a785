#!/usr/bin/env python3
"""prep_same_datasets.py DIR_A DIR_B — the token datasets of two wlb4d-prep
runs are the same, read with h5py (independently of wlb4d's reader).

Both folders must hold the same *.h5 file names (shards included), and each
pair the same objects: every dataset's dtype, shape, chunking, Fletcher32
filter and values byte for byte (/tokens, /doc_offsets, /loss_mask,
/tokenizer/model), and every attribute of the files, groups and datasets,
except the root's `writer` (the program's version). Exit 0 when they are,
1 naming the first differences.
"""
import glob
import os
import sys

import h5py
import numpy as np

SKIP_ATTRS = {"writer"}


def objects(f):
    out = {"/": f}
    f.visititems(lambda name, obj: out.__setitem__("/" + name, obj))
    return out


def attrs(obj, root):
    return {k: obj.attrs[k] for k in obj.attrs if not (root and k in SKIP_ATTRS)}


def same_value(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def compare(pa, pb, bad):
    with h5py.File(pa, "r") as fa, h5py.File(pb, "r") as fb:
        oa, ob = objects(fa), objects(fb)
        if sorted(oa) != sorted(ob):
            bad.append(f"{pa}: objects {sorted(oa)} vs {sorted(ob)} in {pb}")
            return
        for name in sorted(oa):
            a, b = oa[name], ob[name]
            if type(a) is not type(b):
                bad.append(f"{pa}:{name}: a {type(a).__name__} vs a {type(b).__name__}")
                continue
            aa, ab = attrs(a, name == "/"), attrs(b, name == "/")
            if sorted(aa) != sorted(ab):
                bad.append(f"{pa}:{name}: attributes {sorted(aa)} vs {sorted(ab)}")
            for k in sorted(set(aa) & set(ab)):
                if not same_value(aa[k], ab[k]):
                    bad.append(f"{pa}:{name}: attribute {k} = {aa[k]!r} vs {ab[k]!r}")
            if isinstance(a, h5py.Dataset):
                for prop in ("dtype", "shape", "chunks", "fletcher32", "compression"):
                    if getattr(a, prop) != getattr(b, prop):
                        bad.append(f"{pa}:{name}: {prop} {getattr(a, prop)} vs {getattr(b, prop)}")
                if a.shape == b.shape and a.dtype == b.dtype and not same_value(a[()], b[()]):
                    va, vb = a[()], b[()]
                    i = int(np.argmax(va != vb)) if va.ndim == 1 else 0
                    bad.append(f"{pa}:{name}: values differ (first at index {i}: {va.flat[i]} vs {vb.flat[i]})")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    da, db = sys.argv[1], sys.argv[2]
    fa = sorted(os.path.relpath(p, da) for p in glob.glob(os.path.join(da, "**", "*.h5"), recursive=True))
    fb = sorted(os.path.relpath(p, db) for p in glob.glob(os.path.join(db, "**", "*.h5"), recursive=True))
    bad = []
    if not fa:
        bad.append(f"{da}: no .h5 file")
    if fa != fb:
        bad.append(f"files {fa} in {da}, {fb} in {db}")
    for rel in sorted(set(fa) & set(fb)):
        compare(os.path.join(da, rel), os.path.join(db, rel), bad)
    for b in bad[:20]:
        print("prep_same_datasets: " + b)
    print(f"prep_same_datasets: {len(fa)} files compared ({da} vs {db}): "
          + ("the same" if not bad else f"{len(bad)} differences"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
