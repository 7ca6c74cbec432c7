//! Tiny, dependency-free SVG chart writer for benchmark reports.
//!
//! Three chart kinds are provided: [`line_chart_svg`], [`bar_chart_svg`] and
//! [`histograms_svg`]. Each returns a standalone SVG document (with the
//! `xmlns` attribute, a white background and `sans-serif` text) as a `String`.
//! Axes use "nice" ticks (steps of 1, 2 or 5 × 10^k), series are coloured from
//! a fixed palette of 8 colours, and all text is XML-escaped. Non-finite values
//! are skipped, and empty or degenerate inputs yield a valid (possibly empty)
//! chart instead of panicking.

use std::fmt::Write;

/// One named series of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points in drawing order; non-finite coordinates are skipped.
    pub points: Vec<(f64, f64)>,
}

const W: f64 = 800.0;
const H: f64 = 500.0;
const LIM: f64 = 1e300;
const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Escapes text for use in XML content or attribute values.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // Control characters other than whitespace are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// Formats a pixel coordinate; non-finite values become 0.
fn px(v: f64) -> String {
    format!("{:.1}", if v.is_finite() { v } else { 0.0 })
}

/// "Nice" tick positions (steps of 1, 2 or 5 × 10^k) covering `[lo, hi]` with
/// about `target` intervals. Always returns at least two increasing, finite ticks.
fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let (mut lo, mut hi) = if lo.is_finite() && hi.is_finite() {
        (lo.min(hi).clamp(-LIM, LIM), lo.max(hi).clamp(-LIM, LIM))
    } else {
        (0.0, 1.0)
    };
    if hi - lo <= hi.abs().max(lo.abs()) * 1e-12 {
        let d = if lo.abs() < 1e-100 {
            1.0
        } else {
            lo.abs() * 0.1
        };
        (lo, hi) = (lo - d, hi + d);
    }
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let step = mag * [1.0, 2.0, 5.0, 10.0][[1.5, 3.0, 7.0].iter().filter(|&&t| norm >= t).count()];
    if !(step.is_finite() && step > 0.0) {
        return vec![lo, hi];
    }
    let mut first = (lo / step).floor();
    let mut last = (hi / step).ceil().max(first + 1.0);
    if !(last - first).is_finite() || last - first > 1000.0 {
        return vec![lo, hi];
    }
    // Guard against rounding leaving the data range uncovered by an ulp.
    while first * step > lo {
        first -= 1.0;
    }
    while last * step < hi {
        last += 1.0;
    }
    let n = (last - first) as usize;
    (0..=n).map(|k| (first + k as f64) * step).collect()
}

fn tick_step(ticks: &[f64]) -> f64 {
    match ticks {
        [a, b, ..] if b > a => b - a,
        _ => 1.0,
    }
}

/// Scientific notation with at most 3 decimals and no trailing zeros.
fn fmt_sci(v: f64) -> String {
    let s = format!("{v:.3e}");
    match s.split_once('e') {
        Some((m, e)) if m.contains('.') => {
            format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.'))
        }
        _ => s,
    }
}

/// Formats a tick label with as many decimals as the tick step needs.
fn fmt_tick(v: f64, step: f64) -> String {
    let v = if v.abs() < step * 1e-6 { 0.0 } else { v };
    if v != 0.0 && (v.abs() >= 1e7 || step < 1e-4) {
        return fmt_sci(v);
    }
    let dec = (-(step.log10() + 1e-6).floor()).clamp(0.0, 10.0) as usize;
    format!("{v:.dec$}")
}

/// Plot area in pixels (`left`, `right`, `top`, `bottom`) plus the data domain it maps
/// (first and last tick on each axis).
struct Frame {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    xd: (f64, f64),
    yd: (f64, f64),
}

/// Position of `v` within the domain `(a, b)` as a fraction (safe for empty domains).
fn frac(v: f64, (a, b): (f64, f64)) -> f64 {
    (v - a)
        / Some(b - a)
            .filter(|d| d.is_finite() && *d > 0.0)
            .unwrap_or(1.0)
}

fn ends(t: &[f64]) -> (f64, f64) {
    (
        t.first().copied().unwrap_or(0.0),
        t.last().copied().unwrap_or(1.0),
    )
}

impl Frame {
    fn new(right: f64, top: f64, bottom: f64, xt: &[f64], yt: &[f64]) -> Frame {
        let (left, xd, yd) = (80.0, ends(xt), ends(yt));
        Frame {
            left,
            right,
            top,
            bottom,
            xd,
            yd,
        }
    }
    fn sx(&self, x: f64) -> f64 {
        self.left + frac(x, self.xd) * (self.right - self.left)
    }
    fn sy(&self, y: f64) -> f64 {
        self.bottom - frac(y, self.yd) * (self.bottom - self.top)
    }
}

const MID: &str = r#" text-anchor="middle""#;
const END: &str = r#" text-anchor="end""#;
const BOLD: &str = r#" font-weight="bold""#;

/// Appends a `<text>` element; `attrs` holds extra raw attributes (with a leading space).
fn text(o: &mut String, (x, y): (f64, f64), size: u32, attrs: &str, content: &str) {
    let (x, y, c) = (px(x), px(y), esc(content));
    let _ = writeln!(
        o,
        r#"<text x="{x}" y="{y}" font-size="{size}"{attrs}>{c}</text>"#
    );
}

fn line(o: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: &str) {
    let (x1, y1, x2, y2) = (px(x1), px(y1), px(x2), px(y2));
    let _ = writeln!(
        o,
        r#"<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{stroke}"/>"#
    );
}

/// Appends a filled `<rect>`, optionally with a `<title>` tooltip.
fn rect(o: &mut String, (x, y): (f64, f64), (w, h): (f64, f64), fill: &str, tip: Option<&str>) {
    let (x, y, w, h) = (px(x), px(y), px(w), px(h));
    let _ = write!(
        o,
        r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}""#
    );
    match tip {
        Some(t) => _ = writeln!(o, "><title>{}</title></rect>", esc(t)),
        None => o.push_str("/>\n"),
    }
}

fn open_svg(w: f64, h: f64, title: &str) -> String {
    let mut o = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"#
    );
    o.push('\n');
    rect(&mut o, (0.0, 0.0), (w, h), "white", None);
    text(&mut o, (w / 2.0, 30.0), 18, &format!("{MID}{BOLD}"), title);
    o
}

/// Horizontal grid lines, y tick labels, rotated y-axis label and the axis lines.
fn y_axis(o: &mut String, f: &Frame, ticks: &[f64], label: &str) {
    let step = tick_step(ticks);
    for &t in ticks {
        let y = f.sy(t);
        line(o, (f.left, y), (f.right, y), "#e5e5e5");
        text(o, (f.left - 6.0, y + 4.0), 11, END, &fmt_tick(t, step));
    }
    let (x, y) = (f.left - 62.0, (f.top + f.bottom) / 2.0);
    let rot = format!(r#"{MID} transform="rotate(-90 {} {})""#, px(x), px(y));
    text(o, (x, y), 13, &rot, label);
    line(o, (f.left, f.top), (f.left, f.bottom), "#333");
    line(o, (f.left, f.bottom), (f.right, f.bottom), "#333");
}

/// Legend entry text, truncated to 40 characters.
fn short(n: &str) -> String {
    match n.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &n[..i]),
        None => n.to_string(),
    }
}

/// Width and height of the legend box for these entries.
fn legend_size(items: &[String]) -> (f64, f64) {
    let maxc = items
        .iter()
        .map(|n| short(n).chars().count())
        .max()
        .unwrap_or(0);
    (40.0 + maxc as f64 * 7.0, 8.0 + 18.0 * items.len() as f64)
}

/// Legend box in the top-right corner of the plot area (line or square swatches);
/// entry `i` uses palette colour `i`.
fn legend(o: &mut String, f: &Frame, items: &[String], lines: bool) {
    if items.is_empty() {
        return;
    }
    let (w, h) = legend_size(items);
    let (x, y) = (f.right - w - 8.0, f.top + 8.0);
    let (bx, by, bw, bh) = (px(x), px(y), px(w), px(h));
    let _ = writeln!(
        o,
        r##"<rect x="{bx}" y="{by}" width="{bw}" height="{bh}" fill="white" fill-opacity="0.85" stroke="#999"/>"##
    );
    for (i, name) in items.iter().map(|n| short(n)).enumerate() {
        let c = color(i);
        let cy = y + 13.0 + 18.0 * i as f64;
        if lines {
            let (x1, x2, xm, yy) = (px(x + 8.0), px(x + 28.0), px(x + 18.0), px(cy));
            let _ = writeln!(
                o,
                r#"<line x1="{x1}" y1="{yy}" x2="{x2}" y2="{yy}" stroke="{c}" stroke-width="2"/><circle cx="{xm}" cy="{yy}" r="3" fill="{c}"/>"#
            );
        } else {
            rect(o, (x + 12.0, cy - 6.0), (12.0, 12.0), c, None);
        }
        text(o, (x + 34.0, cy + 4.0), 12, "", &name);
    }
}

/// A line chart (each series a polyline with point markers, legend top-right).
pub fn line_chart_svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let ok = |&(x, y): &(f64, f64)| [x, y].iter().all(|v| v.is_finite() && v.abs() <= LIM);
    let finite = |s: &Series| s.points.iter().copied().filter(ok).collect();
    let pts: Vec<Vec<(f64, f64)>> = series.iter().map(finite).collect();
    let (mut xmin, mut xmax, mut ymin, mut ymax) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts.iter().flatten() {
        (xmin, xmax, ymin, ymax) = (xmin.min(x), xmax.max(x), ymin.min(y), ymax.max(y));
    }
    if xmin > xmax {
        (xmin, xmax, ymin, ymax) = (0.0, 1.0, 0.0, 1.0);
    }
    let (xt, yt) = (nice_ticks(xmin, xmax, 5), nice_ticks(ymin, ymax, 5));
    let f = Frame::new(W - 20.0, 50.0, H - 60.0, &xt, &yt);
    let mut o = open_svg(W, H, title);
    let xstep = tick_step(&xt);
    for &t in &xt {
        let x = f.sx(t);
        line(&mut o, (x, f.top), (x, f.bottom), "#e5e5e5");
        text(&mut o, (x, f.bottom + 18.0), 11, MID, &fmt_tick(t, xstep));
    }
    y_axis(&mut o, &f, &yt, y_label);
    text(&mut o, (W / 2.0, H - 18.0), 13, MID, x_label);
    for (i, p) in pts.iter().enumerate() {
        let c = color(i);
        let xy: Vec<(String, String)> =
            p.iter().map(|&(x, y)| (px(f.sx(x)), px(f.sy(y)))).collect();
        if xy.len() >= 2 {
            let coords: Vec<String> = xy.iter().map(|(x, y)| format!("{x},{y}")).collect();
            let coords = coords.join(" ");
            let _ = writeln!(
                o,
                r#"<polyline points="{coords}" fill="none" stroke="{c}" stroke-width="2"/>"#
            );
        }
        for (cx, cy) in &xy {
            let _ = writeln!(o, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{c}"/>"#);
        }
    }
    let names: Vec<String> = series.iter().map(|s| s.name.clone()).collect();
    legend(&mut o, &f, &names, true);
    o.push_str("</svg>");
    o
}

/// A grouped bar chart: `categories` along x; one bar per (category, series) where
/// `values[s][c]` is series s at category c. Legend, value axis from 0.
pub fn bar_chart_svg(
    title: &str,
    y_label: &str,
    categories: &[String],
    series_names: &[String],
    values: &[Vec<f64>],
) -> String {
    let (n_c, n_s) = (categories.len(), values.len().max(series_names.len()));
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for &v in values.iter().flat_map(|r| r.iter().take(n_c)) {
        if v.is_finite() {
            (lo, hi) = (lo.min(v), hi.max(v));
        }
    }
    if lo == hi {
        hi = 1.0;
    }
    let rotate = n_c > 10;
    let bottom = H - if rotate { 100.0 } else { 60.0 };
    let fallback = |s: usize| format!("series {}", s + 1);
    let name = |s: usize| series_names.get(s).cloned().unwrap_or_else(|| fallback(s));
    let names: Vec<String> = (0..n_s).map(name).collect();
    let gw = (W - 100.0) / n_c.max(1) as f64;
    // Add headroom if a bar below the legend box (top-right) would be covered by it.
    let (lw, lh) = legend_size(&names);
    let covered = (((lw + 8.0) / gw).ceil() as usize).min(n_c);
    let under = values
        .iter()
        .flat_map(|r| r.iter().take(n_c).skip(n_c - covered));
    let tail_hi = under
        .filter(|v| v.is_finite())
        .fold(0.0, |a: f64, &b| a.max(b));
    let r = ((lh + 16.0) / (bottom - 50.0)).min(0.5);
    let mut yt = nice_ticks(lo, hi, 5);
    let (y0, y1) = ends(&yt);
    if n_s > 0 && tail_hi > y1 - (y1 - y0) * r {
        yt = nice_ticks(lo, hi + (hi - lo) * r / (1.0 - r), 5);
    }
    let f = Frame::new(W - 20.0, 50.0, bottom, &[], &yt);
    let mut o = open_svg(W, H, title);
    y_axis(&mut o, &f, &yt, y_label);
    let bw = gw * 0.8 / n_s.max(1) as f64;
    let zero = f.sy(0.0);
    for (c, cat) in categories.iter().enumerate() {
        let gx = f.left + gw * c as f64;
        for s in 0..n_s {
            match values.get(s).and_then(|r| r.get(c)) {
                Some(&v) if v.is_finite() => {
                    let (y, x) = (f.sy(v), gx + gw * 0.1 + bw * s as f64);
                    let tip = format!("{}: {v}", name(s));
                    let (top, h) = (y.min(zero), (y - zero).abs());
                    rect(&mut o, (x, top), (bw, h), color(s), Some(&tip));
                }
                _ => {}
            }
        }
        let (x, y) = (gx + gw / 2.0, f.bottom + 18.0);
        let attrs = match rotate {
            true => format!(r#"{END} transform="rotate(-40 {} {})""#, px(x), px(y)),
            false => MID.to_string(),
        };
        text(&mut o, (x, y), 11, &attrs, cat);
    }
    line(&mut o, (f.left, zero), (f.right, zero), "#333");
    legend(&mut o, &f, &names, false);
    o.push_str("</svg>");
    o
}

/// A histogram as bars: `bins` are (label, fraction) pairs drawn left to right, y from 0 to
/// max fraction (at least 0.01). Several histograms are drawn as stacked panels
/// (800 × 220 px each, below a title header).
pub fn histograms_svg(
    title: &str,
    x_label: &str,
    panels: &[(String, Vec<(String, f64)>)],
) -> String {
    const HEADER: f64 = 50.0;
    const PANEL: f64 = 220.0;
    let h = HEADER + PANEL * panels.len() as f64 + 40.0;
    let mut o = open_svg(W, h, title);
    for (i, (name, bins)) in panels.iter().enumerate() {
        let top = HEADER + PANEL * i as f64;
        text(&mut o, (80.0, top + 16.0), 13, BOLD, name);
        let fin = bins.iter().map(|b| b.1).filter(|v| v.is_finite());
        let maxf = fin.fold(0.0, f64::max);
        let yt = nice_ticks(0.0, maxf.clamp(0.01, LIM), 4);
        let f = Frame::new(W - 20.0, top + 28.0, top + PANEL - 40.0, &[], &yt);
        y_axis(&mut o, &f, &yt, "fraction");
        let bw = (f.right - f.left) / bins.len().max(1) as f64;
        let every = bins.len().div_ceil(20).max(1);
        for (j, (label, v)) in bins.iter().enumerate() {
            let x = f.left + bw * j as f64;
            if v.is_finite() && *v > 0.0 {
                let (y, tip) = (f.sy(*v), format!("{label}: {v}"));
                let (x, w, h) = (x + bw * 0.05, bw * 0.9, f.bottom - y);
                rect(&mut o, (x, y), (w, h), color(i), Some(&tip));
            }
            if j % every == 0 {
                text(&mut o, (x + bw / 2.0, f.bottom + 16.0), 11, MID, label);
            }
        }
    }
    text(&mut o, (W / 2.0, h - 12.0), 13, MID, x_label);
    o.push_str("</svg>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cheap well-formedness check: balanced tags, quoted attributes, known entities.
    fn well_formed(s: &str) -> Result<(), String> {
        if !s.starts_with("<svg") || !s.ends_with("</svg>") || !s.contains(r#"xmlns=""#) {
            return Err("not a standalone <svg ...>...</svg> document".into());
        }
        let entities = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"];
        for (i, _) in s.match_indices('&') {
            if !entities.iter().any(|e| s[i..].starts_with(e)) {
                return Err(format!("bad entity at {:?}", &s[i..]));
            }
        }
        let (mut stack, mut rest) = (Vec::new(), s);
        while let Some(i) = rest.find('<') {
            let after = &rest[i + 1..];
            let j = after.find('>').ok_or("unterminated tag")?;
            let tag = &after[..j];
            if rest[..i].contains('>') || tag.contains('<') || tag.matches('"').count() % 2 != 0 {
                return Err(format!("malformed markup near {tag:?}"));
            }
            if let Some(name) = tag.strip_prefix('/') {
                if stack.pop() != Some(name) {
                    return Err(format!("unbalanced </{name}>"));
                }
            } else if !tag.ends_with('/') {
                stack.push(tag.split_whitespace().next().ok_or("empty tag")?);
            }
            rest = &after[j + 1..];
            if stack.is_empty() && !rest.trim().is_empty() {
                return Err("content after root element".into());
            }
        }
        match stack.is_empty() {
            true => Ok(()),
            false => Err(format!("unclosed tags {stack:?}")),
        }
    }

    fn assert_ok(s: &str) {
        well_formed(s).unwrap_or_else(|e| panic!("{e}\n{s}"));
        assert!(s.contains(r#"font-family="sans-serif""#));
        assert!(!s.contains("NaN") && !s.contains("inf"), "{s}");
    }

    fn ser(name: &str, p: &[(f64, f64)]) -> Series {
        let (name, points) = (name.to_string(), p.to_vec());
        Series { name, points }
    }

    #[test]
    fn checker_rejects_bad_input() {
        let head = r#"<svg xmlns="http://www.w3.org/2000/svg">"#;
        assert!(well_formed(&format!("{head}<g></svg>")).is_err());
        assert!(well_formed(&format!("{head}a & b</svg>")).is_err());
        assert!(well_formed(&format!("{head}<g/><a x=\"1\">&lt;</a></svg>")).is_ok());
    }

    #[test]
    fn line_chart_basic() {
        let a = ser("a", &[(1.0, 2.0), (2.0, 3.5), (4.0, 1.0)]);
        let svg = line_chart_svg("T", "x", "y", &[a, ser("b", &[(0.0, 0.0), (3.0, 9.0)])]);
        assert_ok(&svg);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches(r#"r="3""#).count(), 5 + 2);
        assert!(svg.contains(PALETTE[0]) && svg.contains(PALETTE[1]));
        assert!(svg.contains(r#"width="800" height="500""#));
    }

    #[test]
    fn bar_axis_headroom_only_when_legend_would_cover_bars() {
        let cats = vec!["a".to_string(), "b".to_string()];
        let low_tail = bar_chart_svg("t", "y", &cats, &[], &[vec![1.0, 0.1]]);
        assert!(low_tail.contains(">1.0</text>") && !low_tail.contains(">1.2</text>"));
        let high_tail = bar_chart_svg("t", "y", &cats, &[], &[vec![0.1, 1.0]]);
        assert!(high_tail.contains(">1.2</text>"));
        assert_ok(&low_tail);
    }

    #[test]
    fn escaping() {
        let nasty = r#"a<b & "c" 'd'>"#;
        let want = "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;";
        assert_eq!(esc(nasty), want);
        let svg = line_chart_svg(nasty, nasty, nasty, &[ser(nasty, &[(0.0, 1.0)])]);
        assert_ok(&svg);
        assert_eq!(svg.matches(want).count(), 4);
        let names = vec![nasty.to_string()];
        let bar = bar_chart_svg(nasty, nasty, &names, &names, &[vec![1.0]]);
        let hist = histograms_svg(nasty, nasty, &[(nasty.into(), vec![(nasty.into(), 0.5)])]);
        for svg in [bar, hist] {
            assert_ok(&svg);
            assert!(!svg.contains(nasty) && svg.contains(want));
        }
    }

    #[test]
    fn nice_ticks_cover_range() {
        let cases: [f64; 26] = [
            0.0, 1.0, 0.3, 0.7, -13.0, 87.0, 1e-9, 3e-9, 5.0, 5.0, 0.0, 0.0, -2.5, -2.5, 1.2e5,
            9.9e8, 1e20, 1e20, 4.2e12, 4.3e12, -1e300, 1e300, 0.1, 0.3, 7.0, -3.0,
        ];
        assert!(nice_ticks(0.1, 0.1 + 0.2, 5).last() >= Some(&(0.1 + 0.2)));
        for c in cases.chunks(2) {
            let (lo, hi) = (c[0].min(c[1]), c[0].max(c[1]));
            let t = nice_ticks(c[0], c[1], 5);
            assert!(t.len() >= 2 && t.len() <= 12, "{lo}..{hi}: {t:?}");
            assert!(t[0] <= lo && *t.last().unwrap() >= hi, "{lo}..{hi}: {t:?}");
            assert!(t.iter().all(|v| v.is_finite()) && t.windows(2).all(|w| w[1] > w[0]));
            let step = t[1] - t[0];
            let m = step / 10f64.powf(step.log10().floor());
            let nice = [1.0, 2.0, 5.0, 10.0].iter().any(|n| (m - n).abs() < 1e-6);
            assert!(t.len() == 2 || nice, "{step}");
        }
        assert_eq!(nice_ticks(0.0, 10.0, 5), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert!(nice_ticks(f64::NAN, f64::INFINITY, 5).len() >= 2);
    }

    #[test]
    fn tick_labels() {
        assert_eq!(fmt_tick(0.1 + 0.2, 0.1), "0.3");
        assert_eq!(fmt_tick(-1e-17, 0.1), "0.0");
        assert_eq!(fmt_tick(40.0, 20.0), "40");
        assert_eq!(fmt_tick(2e7, 1e7), "2e7");
        assert_eq!(fmt_tick(2.5e-6, 5e-7), "2.5e-6");
    }

    #[test]
    fn degenerate_line_inputs() {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        let many: Vec<Series> = (0..10).map(|i| ser("s", &[(i as f64, 1.0)])).collect();
        let cases = [
            vec![],
            vec![ser("empty", &[])],
            vec![ser("one", &[(3.0, 4.0)])],
            vec![ser("flat", &[(1.0, 2.0), (2.0, 2.0), (3.0, 2.0)])],
            vec![ser("same x", &[(1.0, 1.0), (1.0, 5.0)])],
            vec![ser(
                "bad",
                &[(nan, 1.0), (1.0, inf), (-inf, nan), (2.0, 3.0)],
            )],
            vec![ser("all bad", &[(nan, nan), (inf, -inf)])],
            vec![ser("huge", &[(0.0, f64::MAX), (1.0, -f64::MAX)])],
            many,
        ];
        for s in &cases {
            assert_ok(&line_chart_svg("t", "x", "y", s));
        }
    }

    #[test]
    fn degenerate_bar_and_hist_inputs() {
        let cats: Vec<String> = (0..14).map(|i| format!("c{i}")).collect();
        let (c2, c3) = (&cats[..2], &cats[..3]);
        let names = vec!["a".to_string(), "b".to_string()];
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        assert_ok(&bar_chart_svg("t", "y", &[], &[], &[]));
        assert_ok(&bar_chart_svg("t", "y", c2, &names, &[]));
        assert_ok(&bar_chart_svg(
            "t",
            "y",
            c3,
            &names,
            &[vec![0.0; 3], vec![0.0]],
        ));
        assert_ok(&bar_chart_svg(
            "t",
            "y",
            c2,
            &[],
            &[vec![nan, 2.0], vec![-1.0, inf]],
        ));
        let svg = bar_chart_svg("t", "y", &cats, &names, &[vec![1.0; 14], vec![2.0; 20]]);
        assert_ok(&svg);
        assert_eq!(svg.matches("<title>").count(), 28);
        assert_ok(&histograms_svg("t", "x", &[]));
        let bins = |v: &[f64]| {
            v.iter()
                .enumerate()
                .map(|(i, f)| (i.to_string(), *f))
                .collect()
        };
        let panels = vec![
            ("empty".to_string(), vec![]),
            ("zeros".to_string(), bins(&[0.0, nan, -1.0, inf])),
            ("uniform".to_string(), bins(&[1.0 / 64.0; 64])),
        ];
        let svg = histograms_svg("t", "batch size", &panels);
        assert_ok(&svg);
        assert!(svg.contains(r#"height="750""#));
    }
}
