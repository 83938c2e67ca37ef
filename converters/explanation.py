"""--explain DIR: where the precision went, written for a person and for Model Explorer.

The sandbox's worker compares every tensor of the .tflite with the float model (`running/explain.py`) and
answers with rows of figures; the report that carries them was checked against its schema and made inert
(`Report.from_untrusted`). Here, outside, three files are made of them, each written whole or not at all,
never over a file without `force`:

* `report.json`: the conversion's report, the explanation in it;
* `index.html`: one page with nothing to fetch and no script: the worst tensors first, with bars, the
  signal-to-noise ratio against depth, a heat strip of the loss, and a histogram of the worst tensor's error;
* `model_explorer.json`: Model Explorer's node data (`model-explorer model.tflite --node_data_paths
  model_explorer.json`), each tensor by its name in the .tflite, coloured by the decibels it lost.

No TensorFlow here: this runs in the caller's process.
"""

import html
import json
import os

from . import errors
from . import paths

FILES = ("report.json", "index.html", "model_explorer.json")


def rounding_db(bits):
    """The signal-to-noise ratio a `bits`-bit grid gives a signal that fills it uniformly: what rounding to it
    costs at best (6.02 dB a bit, and 1.76). A tensor has lost only what it falls below this, or below what it
    was computed from, whichever is lower (running/explain.py): int8's first layer is not to blame for being
    int8."""
    return 6.02 * bits + 1.76


# The level the page's plot marks: int8's rounding at best.
_INT8_ROUNDING_DB = rounding_db(8)
# From no loss to the most: white, amber, red (Model Explorer's gradient, and the page's).
_COLOURS = ((0.0, (255, 255, 255)), (0.5, (253, 174, 97)), (1.0, (215, 25, 28)))


def check_folder(folder, force):
    """Fail before any work where the explanation could not be written: a file where the folder should be, a
    folder that cannot be made, or one of its files there already without `force`."""
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise errors.OutputExists(f"{folder}: exists and is not a folder, for --explain")
    paths.check_output_path(os.path.join(folder if os.path.isdir(folder) else os.path.dirname(folder), "x"), True)
    for name in FILES:
        if os.path.exists(os.path.join(folder, name)) and not force:
            raise errors.OutputExists(f"{os.path.join(folder, name)}: exists; pass --force to overwrite it")


def write(folder, report, force):
    """The three files of `report`'s explanation in `folder` (made if missing); their folder."""
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    report.explained_in = folder
    files = {"report.json": report.to_json().encode(), "index.html": page(report).encode(),
             "model_explorer.json": json.dumps(node_data(report.explanation), indent=1).encode()}
    for name, data in files.items():
        paths.write_atomically(data, os.path.join(folder, name), force)
    return folder


def node_data(explanation):
    """Model Explorer's GraphNodeData: {tensor name: {"value": decibels lost}}, with a gradient from none to the
    most."""
    return {"name": "keras-gelu: signal lost (dB)",
            "results": {row["name"]: {"value": round(row["lost_db"], 3)} for row in explanation["tensors"]},
            "gradient": [{"stop": stop, "bgColor": _hex(colour)} for stop, colour in _COLOURS]}


def _row_named(explanation, name):
    return next((row for row in explanation["tensors"] if row["name"] == name), None)


def where_lost(explanation):
    """The phrase naming the tensor where the signal went, and the outlier channel before it, or "" (where the
    explanation names no row of its own: it came from the worker)."""
    row = _row_named(explanation, explanation["worst"])
    if row is None:
        return ""
    phrase = (f"the signal is lost first in {row['layer'] or row['name']} ({row['op']}: cosine {row['cosine']:.3f}, "
              f"{row['lost_db']:.1f} dB lost there)")
    above = _row_named(explanation, explanation.get("worst_outlier"))
    if above is not None and above["outlier"]:
        phrase += (f", after {above['layer'] or above['name']}'s channel {above['outlier']['channel']} reached "
                   f"{above['outlier']['ratio']:.0f}x the median channel's range")
    return phrase


def _hex(colour):
    return "#" + "".join(f"{channel:02x}" for channel in colour)


def _colour(fraction):
    """The gradient's colour at `fraction` (0 to 1), interpolated."""
    fraction = min(1.0, max(0.0, fraction))
    for (low, low_colour), (high, high_colour) in zip(_COLOURS, _COLOURS[1:]):
        if fraction <= high:
            t = (fraction - low) / (high - low)
            return _hex(tuple(round(a + (b - a) * t) for a, b in zip(low_colour, high_colour)))
    return _hex(_COLOURS[-1][1])


def _e(value):
    return html.escape(str(value), quote=True)


def worst_first(explanation):
    return sorted(explanation["tensors"], key=lambda row: (-row["lost_db"], row["snr_db"], row["position"]))


def _snr_plot(rows, worst):
    """Each tensor's signal-to-noise ratio against its depth (the position of its op), int8's rounding marked."""
    width, height, left, bottom = 720, 220, 48, 28
    if not rows:
        return ""
    last = max(row["position"] for row in rows) or 1
    top_db = max(60.0, max(row["snr_db"] for row in rows))

    def x(position):
        return left + (width - left - 10) * position / last

    def y(db):
        return 10 + (height - bottom - 10) * (1 - max(0.0, min(db, top_db)) / top_db)

    ordered = sorted(rows, key=lambda row: row["position"])
    line = " ".join(f"{x(row['position']):.1f},{y(row['snr_db']):.1f}" for row in ordered)
    dots = "".join(
        f'<circle cx="{x(row["position"]):.1f}" cy="{y(row["snr_db"]):.1f}" r="{5 if row["name"] == worst else 2.5}"'
        f' fill="{"#d7191c" if row["name"] == worst else "#2c7bb6"}"><title>{_e(row["layer"])} {_e(row["op"])}: '
        f'{row["snr_db"]:.1f} dB</title></circle>' for row in ordered)
    ticks = "".join(f'<text x="{left - 6}" y="{y(db) + 4:.1f}" text-anchor="end">{db:.0f}</text>'
                    f'<line x1="{left}" x2="{width - 10}" y1="{y(db):.1f}" y2="{y(db):.1f}" class="grid"/>'
                    for db in range(0, int(top_db) + 1, 20))
    rounding = (f'<line x1="{left}" x2="{width - 10}" y1="{y(_INT8_ROUNDING_DB):.1f}" y2="{y(_INT8_ROUNDING_DB):.1f}"'
                f' class="rounding"/><text x="{width - 12}" y="{y(_INT8_ROUNDING_DB) - 4:.1f}" text-anchor="end">'
                f'int8 rounding at best</text>')
    return (f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="signal-to-noise ratio against depth">'
            f'{ticks}{rounding}<polyline points="{line}" class="trace"/>{dots}'
            f'<text x="{left}" y="{height - 6}">input</text><text x="{width - 10}" y="{height - 6}" '
            f'text-anchor="end">output (op {last})</text></svg>')


def _heat_strip(rows, most):
    """One cell per tensor, in the order the ops run, coloured by the decibels it lost."""
    if not rows:
        return ""
    ordered = sorted(rows, key=lambda row: row["position"])
    width = 720 / len(ordered)
    cells = "".join(f'<rect x="{index * width:.2f}" y="0" width="{width + 0.5:.2f}" height="24" '
                    f'fill="{_colour(row["lost_db"] / most)}"><title>{_e(row["layer"])} {_e(row["op"])}: '
                    f'{row["lost_db"]:.1f} dB lost</title></rect>' for index, row in enumerate(ordered))
    return f'<svg viewBox="0 0 720 24" role="img" aria-label="loss by depth" class="strip">{cells}</svg>'


def _histogram(histogram, name):
    """The worst tensor's errors against the float model, as bars."""
    if not histogram or not histogram["counts"]:
        return ""
    width, height, counts, edges = 720, 160, histogram["counts"], histogram["edges"]
    peak = max(counts) or 1
    bar = (width - 20) / len(counts)
    bars = "".join(f'<rect x="{10 + index * bar:.1f}" y="{height - 24 - (height - 34) * count / peak:.1f}" '
                   f'width="{max(bar - 1, 0.5):.1f}" height="{(height - 34) * count / peak:.1f}" class="bar">'
                   f'<title>{edges[index]:.3g} to {edges[index + 1]:.3g}: {count}</title></rect>'
                   for index, count in enumerate(counts))
    return (f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="errors of {_e(name)}">{bars}'
            f'<text x="10" y="{height - 6}">{edges[0]:.3g}</text><text x="{width / 2}" y="{height - 6}" '
            f'text-anchor="middle">error against the float model</text><text x="{width - 10}" y="{height - 6}" '
            f'text-anchor="end">{edges[-1]:.3g}</text></svg>')


def _number(value, digits=3):
    return "" if value is None else f"{value:.{digits}g}"


def _table(rows, most):
    header = ("<tr><th>#</th><th>layer</th><th>op</th><th>type</th><th>lost (dB)</th><th>SNR (dB)</th>"
              "<th>cosine</th><th>max abs</th><th>steps</th><th>outlier channel</th><th>GELU became</th></tr>")
    body = []
    for rank, row in enumerate(rows, 1):
        share = 100 * row["lost_db"] / most
        outlier = "" if not row["outlier"] else f'{row["outlier"]["channel"]} ({row["outlier"]["ratio"]:.0f}x median)'
        body.append(
            f'<tr><td class="n">{rank}</td><td class="name" title="{_e(row["name"])}">'
            f'{_e(row["layer"] or row["name"])}</td><td>{_e(row["op"])}</td><td class="n">{_e(row["type"])}</td>'
            f'<td class="lost n"><span style="width:{share:.1f}%;background:{_colour(row["lost_db"] / most)}"></span>'
            f'{row["lost_db"]:.1f}</td><td class="n">{row["snr_db"]:.1f}</td><td class="n">{row["cosine"]:.5f}</td>'
            f'<td class="n">{_number(row["max_abs"])}</td><td class="n">{_number(row["steps"], 4)}</td>'
            f'<td>{_e(outlier)}</td><td>{_e(row["gelu"] or "")}</td></tr>')
    return f'<table>{header}{"".join(body)}</table>'


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:980px;padding:0 1em;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:2em} svg{width:100%;height:auto;display:block}
svg text{font-size:11px;fill:#555} .grid{stroke:#eee} .rounding{stroke:#999;stroke-dasharray:4 3}
.trace{fill:none;stroke:#2c7bb6;stroke-width:1.5} .bar{fill:#d7191c} .strip{border:1px solid #ccc}
table{border-collapse:collapse;width:100%;font-size:12px} th,td{padding:3px 6px;border-bottom:1px solid #eee;
text-align:left;vertical-align:top} td.n{white-space:nowrap} td.name{min-width:12em;overflow-wrap:anywhere}
td.lost{position:relative;min-width:90px} td.lost span{position:absolute;left:0;top:2px;
bottom:2px;z-index:-1} .verdict{padding:.6em 1em;border-radius:4px;background:#f4f4f4} .fail{background:#fde0dd}
"""


def page(report):
    """The explanation as one self-contained HTML page."""
    explanation = report.explanation
    rows = worst_first(explanation)
    most = max([row["lost_db"] for row in rows] + [1.0])
    worst = rows[0] if rows else None
    budget = report.budget
    if budget:
        verdict = (f'<p class="verdict{"" if budget["passed"] else " fail"}">{_e(budget["output"])}: cosine '
                   f'{budget["cosine"]:.6f} against the float model, budget {budget["min_cosine"]:g}: '
                   f'{"met" if budget["passed"] else "missed, nothing written"}.</p>')
    else:
        verdict = ""
    lost = where_lost(explanation)
    worst_line = f'<p id="worst">{_e(lost[:1].upper() + lost[1:])}.</p>' if lost else ""
    gelus = sorted(explanation["gelus"], key=lambda row: row["position"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>keras-gelu: where the precision goes</title>
<meta name="viewport" content="width=device-width"><style>{_STYLE}</style></head><body>
<h1>Where the precision goes: {_e(report.input)}</h1>
<p>{_e(report.mode)} mode{", int8" if report.int8 else ""}; every tensor against {_e(explanation["reference"])},
on {explanation["samples"]} samples ({_e(report.inputs_used)}).</p>
{verdict}{worst_line}
<h2>Signal-to-noise ratio against depth</h2>{_snr_plot(rows, worst and worst["name"])}
<h2>Where it was lost, op by op</h2>{_heat_strip(rows, most)}
<h2>Errors of the worst tensor</h2>{_histogram(explanation["histogram"], worst["name"] if worst else "")}
<h2>Tensors, the worst first</h2>
<p>Lost: how far a tensor falls below what it was computed from (or below its type's rounding at best).</p>
{_table(rows, most)}
<h2>GELUs</h2>{_table(gelus, most) if gelus else "<p>No GELU found.</p>"}
</body></html>
"""
