//! SVG line charts for the reports: no dependency, one polyline per series.

use std::fmt::Write as _;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A chart's line: label, colour, (x, y) points.
pub type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// A line chart: x in seconds, one polyline per series, vertical marks for notes.
pub fn line_chart(title: &str, y_label: &str, series: &[Series], marks: &[(f64, String)]) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 320.0, 64.0, 16.0, 40.0, 44.0);
    let all = series.iter().flat_map(|s| s.2.iter());
    let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = nice(all.map(|p| p.1).filter(|v| v.is_finite()).fold(0.0, f64::max));
    let x = |v: f64| left + (w - left - right) * v / x_max;
    let y = |v: f64| top + (h - top - bottom) * (1.0 - v / y_max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{left}" y="18" font-size="14" font-weight="bold">{}</text>"#, esc(title));
    for k in 0..=4 {
        let v = y_max * k as f64 / 4.0;
        let yy = y(v);
        let _ = writeln!(s, r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##, w - right);
        let _ =
            writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, left - 4.0, yy + 4.0, fmt_num(v));
    }
    for k in 0..=5 {
        let v = x_max * k as f64 / 5.0;
        let _ =
            writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{:.0} s</text>"#, x(v), h - bottom + 16.0, v);
    }
    let _ = writeln!(
        s,
        r#"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"#,
        top + (h - top - bottom) / 2.0,
        top + (h - top - bottom) / 2.0,
        esc(y_label)
    );
    for (t, note) in marks {
        let xx = x(*t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#999" stroke-dasharray="3,3"><title>{}</title></line>"##,
            h - bottom,
            esc(note)
        );
    }
    for (k, (label, color, pts)) in series.iter().enumerate() {
        if !pts.is_empty() {
            let path: Vec<String> =
                pts.iter().filter(|p| p.1.is_finite()).map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b))).collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
                path.join(" ")
            );
        }
        let lx = left + 10.0 + (200.0f64).min((w - left - right) / series.len() as f64) * k as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="3" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            h - 14.0,
            lx + 16.0,
            h - 10.0,
            esc(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn nice(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|v| *v >= max).unwrap_or(10.0 * mag)
}

fn fmt_num(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_with_one_line_per_series() {
        let svg = line_chart(
            "t <x>",
            "ms",
            &[("a", "#000", vec![(0.0, 1.0), (1.0, 3.0)]), ("b", "#111", vec![(0.0, 2.0)])],
            &[(0.5, "kill".into())],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;x&gt;"), "titles are escaped");
        assert!(svg.contains("<title>kill</title>"));
    }

    #[test]
    fn axis_maxima_are_round() {
        assert_eq!(nice(7.3), 10.0);
        assert_eq!(nice(180.0), 200.0);
        assert_eq!(nice(0.0), 1.0);
    }
}
