#!/usr/bin/env python3
"""plot_timing.py draws each pipeline action kind in one colour in every panel,
and the planner's imbalance lines in no step-time category's colour.

  plot_colors_check.py SCRIPTS_DIR TIMING.h5 OUT.png

Runs plot_timing.main on the log, keeps the figure, and checks: the step-time
bars 'forward', 'backward', 'p2p_wait' have the colours of the timeline's
F, B and send/recv bars (ACTION_COLORS, and the timeline's own bars when the
log has a trace), and no other bar or line of any panel uses one of them.
"""
import importlib.util
import sys

import matplotlib.colors as mc

scripts, timing, out = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("plot_timing", f"{scripts}/plot_timing.py")
pt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pt)
figs = []
pt.plt.close = lambda fig=None: figs.append(fig)
pt.main([timing, "-o", out])
figs = [f for f in figs if hasattr(f, "axes")]  # plt.close("all") and the like pass no figure
assert figs, "no figure"
rgb = lambda c: tuple(round(x, 3) for x in mc.to_rgb(c))
action = {k: rgb(v) for k, v in pt.ACTION_COLORS.items()}
category = {rgb(v): k for k, v in pt.CATEGORY_COLORS.items()}
want = {"forward": action["F"], "backward": action["B"], "p2p_wait": action["msg"],
        "forward (F)": action["F"], "backward (B)": action["B"], "weight grad (W)": action["W"],
        "send/recv": action["msg"]}
bad, seen = [], set()
for ax in figs[0].axes:
    for coll in ax.collections:  # broken_barh: the timeline
        lab = coll.get_label()
        for fc in coll.get_facecolors():
            c = tuple(round(x, 3) for x in fc[:3])
            if lab in want:
                seen.add(lab)
                if c != want[lab]:
                    bad.append(f"{ax.get_title()}: '{lab}' drawn in {c}, want {want[lab]}")
    for cont in ax.containers:  # bar(): the step-time breakdown
        lab = cont.get_label()
        for p in cont.patches:
            c = tuple(round(x, 3) for x in p.get_facecolor()[:3])
            if lab in want:
                seen.add(lab)
                if c != want[lab]:
                    bad.append(f"{ax.get_title()}: bar '{lab}' in {c}, want {want[lab]}")
            elif c in action.values():
                bad.append(f"{ax.get_title()}: bar '{lab}' uses an action kind's colour {c}")
    for line in ax.get_lines():
        c = rgb(line.get_color())
        if c in action.values():
            bad.append(f"{ax.get_title()}: line '{line.get_label()}' uses an action kind's colour {c}")
        # The planner's lines must not look like a step-time category.
        if line.get_label().startswith("planner ") and c in category:
            bad.append(f"{ax.get_title()}: line '{line.get_label()}' uses category {category[c]}'s colour {c}")
if not {"forward", "backward"} <= seen:
    bad.append(f"the step-time breakdown lacks forward/backward bars (saw {sorted(seen)})")
if bad:
    sys.exit("plot_colors_check: " + "\n".join(bad))
print(f"plot_colors_check: OK ({sorted(seen)})")
