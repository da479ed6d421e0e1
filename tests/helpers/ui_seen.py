"""What a person sees in a chart drawn in the browser, read back from the page: every
visible text's box (Plotly's SVG text; ECharts' canvas text from its zrender display
list), the plot areas (Plotly's ``_fullLayout._size`` and subplot drag rects; ECharts'
grid rects), the legend's box, the axis ranges. Boxes are ``[x, y, w, h]`` in CSS px
from the chart's top left. The checks return a list of problems (empty: readable), so
one assertion names everything wrong on a page at once."""

from __future__ import annotations

# The ECharts instance behind a chart element: Streamlit keeps it in a React hook of
# one of the element's fibers (ECharts' own getInstanceByDom is not exported there).
_ECHARTS = """
const findChart = (el) => {
  const key = Object.keys(el).find((k) => k.startsWith('__reactFiber'));
  const isChart = (o) => o && typeof o.getZr === 'function' && typeof o.getModel === 'function';
  const seen = new Set();
  const scan = (o, depth) => {
    if (!o || typeof o !== 'object' || depth > 3 || seen.has(o)) return null;
    seen.add(o);
    if (isChart(o)) return o;
    for (const k of Object.keys(o)) {
      try { const got = scan(o[k], depth + 1); if (got) return got; } catch (e) {}
    }
    return null;
  };
  for (let f = el[key], i = 0; f && i < 40; i++, f = f.return) {
    for (let h = f.memoizedState, j = 0; h && j < 80; j++, h = h.next) {
      const got = scan(h.memoizedState, 0);
      if (got) return got;
    }
  }
  return null;
};
const box = (el) => {
  const r = el.getBoundingRect().clone();
  const m = el.getComputedTransform ? el.getComputedTransform() : el.transform;
  if (m) r.applyTransform(m);
  return [r.x, r.y, r.width, r.height];
};
"""

ECHARTS_SEEN = (
    "(el) => {"
    + _ECHARTS
    + """
  const chart = findChart(el);
  if (!chart) return null;
  const texts = [];
  for (const d of chart.getZr().storage.getDisplayList(true)) {
    const t = d.style && d.style.text;
    if (d.invisible || d.ignore || t === undefined || t === null || String(t).trim() === '') continue;
    texts.push({ text: String(t), box: box(d) });
  }
  const grids = [];
  for (let i = 0, g; (g = chart.getModel().getComponent('grid', i)); i++) {
    const r = g.coordinateSystem.getRect();
    grids.push([r.x, r.y, r.width, r.height]);
  }
  const bars = [];
  for (const v of chart._componentsViews || []) {
    if (v.type && v.type.startsWith('visualMap') && v._shapes && v._shapes.barGroup) {
      bars.push(box(v._shapes.barGroup));
    }
  }
  return { texts, grids, bars, width: chart.getWidth(), height: chart.getHeight() };
}"""
)

PLOTLY_SEEN = """(gd) => {
  const origin = gd.getBoundingClientRect();
  const rel = (r) => [r.left - origin.left, r.top - origin.top, r.width, r.height];
  const texts = [];
  for (const t of gd.querySelectorAll('svg text')) {
    const r = t.getBoundingClientRect();
    const s = getComputedStyle(t);
    if (!t.textContent.trim() || r.width === 0 || s.display === 'none' || s.visibility === 'hidden'
        || s.opacity === '0') continue;
    const cls = t.getAttribute('class') || '';
    const tick = t.closest('.ytick') ? 'ytick' : t.closest('.xtick') ? 'xtick' : '';
    texts.push({ text: t.textContent, box: rel(r), cls: tick || cls });
  }
  const legend = gd.querySelector('.legend');
  const fl = gd._fullLayout;
  const areas = Array.from(gd.querySelectorAll('.draglayer .nsewdrag'), (d) => rel(d.getBoundingClientRect()));
  const ya = fl.yaxis || {};
  return {
    texts,
    areas,
    legend: legend ? rel(legend.getBoundingClientRect()) : null,
    plot: [fl._size.l, fl._size.t, fl._size.w, fl._size.h],
    xrange: fl.xaxis ? fl.xaxis.range.map(Number) : null,
    categories: ya.categoryarray ? Array.from(ya.categoryarray) : [],
    width: fl.width,
    height: fl.height,
  };
}"""

METRICS_CUT = """() => Array.from(document.querySelectorAll('[data-testid=stMetricValue]'))
  .filter((m) => { const d = m.querySelector('div') || m; return d.scrollWidth > d.clientWidth + 1; })
  .map((m) => m.innerText)"""
"""The headline metrics whose value is cut (drawn with an ellipsis)."""


GAP_PX = 6
"""The least space (px) between a colour bar and a plot."""


def overlap(a, b, slack: float = 1.0) -> bool:
    """Whether boxes ``a`` and ``b`` ([x, y, w, h], px) share more than ``slack`` px
    each way."""
    return (
        min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]) > slack
        and min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]) > slack
    )


def inside(a, frame, slack: float = 1.0) -> bool:
    """Whether box ``a`` lies within ``frame`` (both [x, y, w, h], px)."""
    return (
        a[0] >= frame[0] - slack
        and a[1] >= frame[1] - slack
        and a[0] + a[2] <= frame[0] + frame[2] + slack
        and a[1] + a[3] <= frame[1] + frame[3] + slack
    )


def text_overlaps(texts: list[dict]) -> list[str]:
    """Each pair of visible texts whose boxes overlap, as a problem line."""
    out = []
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            if overlap(a["box"], b["box"]):
                out.append(f"text {a['text']!r} overlaps text {b['text']!r}")
    return out


def plotly_problems(seen: dict, in_plot_ok=lambda t: False) -> list[str]:
    """Overlapping texts, the legend over a plot area, texts cut off at the figure's
    edge, and texts drawn over a plot area (unless ``in_plot_ok(text)``)."""
    out = text_overlaps(seen["texts"])
    frame = [0, 0, seen["width"], seen["height"]]
    legend = seen["legend"]
    for area in seen["areas"]:
        if legend and overlap(legend, area):
            out.append(f"the legend {legend} covers the plot area {area}")
    for t in seen["texts"]:
        if not inside(t["box"], frame):
            out.append(f"text {t['text']!r} is cut at the figure's edge {t['box']}")
        if (
            t["cls"] in ("ytick", "xtick")
            or in_plot_ok(t["text"])
            or inside(t["box"], legend or [0, 0, 0, 0])
        ):
            continue
        for area in seen["areas"]:
            if overlap(t["box"], area, slack=2.0):
                out.append(f"text {t['text']!r} is drawn over the plot area {area}")
    return out


def echarts_problems(seen: dict, in_grid_ok=lambda t: False) -> list[str]:
    """Overlapping texts, texts over a grid (unless ``in_grid_ok(text)``) or over a
    colour bar, texts cut off at the chart's edge."""
    out = text_overlaps(seen["texts"])
    frame = [0, 0, seen["width"], seen["height"]]
    for t in seen["texts"]:
        if not inside(t["box"], frame):
            out.append(f"text {t['text']!r} is cut at the chart's edge {t['box']}")
        for grid in [] if in_grid_ok(t["text"]) else seen["grids"]:
            if overlap(t["box"], grid, slack=2.0):
                out.append(f"text {t['text']!r} is drawn over the plot {grid}")
        for bar in seen["bars"]:
            if overlap(t["box"], bar):
                out.append(f"text {t['text']!r} sits on the colour bar {bar}")
    for bar in seen["bars"]:
        near = [bar[0] - GAP_PX, bar[1] - GAP_PX, bar[2] + 2 * GAP_PX, bar[3] + 2 * GAP_PX]
        out += [
            f"the colour bar {bar} touches the plot {g}" for g in seen["grids"] if overlap(near, g)
        ]
    return out
