//! Minimal SVG bar charts for numbers people compare (evaluation metrics, benchmark latencies).

/// Horizontal grouped bars: one group per row label, one bar per series.
pub fn grouped_bars(title: &str, unit: &str, series: &[&str], rows: &[(String, Vec<f64>)]) -> String {
    const COLORS: [&str; 6] = ["#0b6e99", "#e07b39", "#3a9d5d", "#8e5ea2", "#c0392b", "#7f8c8d"];
    let bar_h = 14.0;
    let gap = 10.0;
    let left = 150.0;
    let width = 720.0;
    let plot_w = width - left - 80.0;
    let group_h = series.len() as f64 * bar_h + gap;
    let height = 60.0 + rows.len() as f64 * group_h + 30.0;
    let max = rows.iter().flat_map(|r| r.1.iter().copied()).fold(0.0f64, f64::max).max(1e-9);
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        esc(title)
    );
    for (i, s) in series.iter().enumerate() {
        let x = left + i as f64 * 120.0;
        svg += &format!(
            "<rect x=\"{x}\" y=\"34\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"43\">{}</text>\n",
            COLORS[i % COLORS.len()],
            x + 14.0,
            esc(s)
        );
    }
    for (r, (label, values)) in rows.iter().enumerate() {
        let y0 = 60.0 + r as f64 * group_h;
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
            left - 8.0,
            y0 + group_h / 2.0,
            esc(label)
        );
        for (i, v) in values.iter().enumerate() {
            let w = plot_w * v / max;
            let y = y0 + i as f64 * bar_h;
            svg += &format!(
                "<rect x=\"{left}\" y=\"{y}\" width=\"{w:.1}\" height=\"{}\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}{}</text>\n",
                bar_h - 2.0,
                COLORS[i % COLORS.len()],
                left + w + 4.0,
                y + bar_h - 4.0,
                number(*v),
                esc(unit)
            );
        }
    }
    svg += "</svg>\n";
    svg
}

/// A value as a chart labels it: a count as a whole number (48, not 48.000), anything else to three decimals
/// without trailing zeros (0.915, 12.5).
pub fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return format!("{v:.0}");
    }
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_string() }
}

/// Several charts (each a whole `<svg>` as [`grouped_bars`] returns) one below the other in one SVG document.
pub fn stack(charts: &[String]) -> String {
    // The size of a chart, from the width/height attributes of its root element.
    fn attr(svg: &str, name: &str) -> f64 {
        let head = &svg[..svg.find('>').unwrap_or(svg.len())];
        head.split(&format!(" {name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
    let width = charts.iter().map(|c| attr(c, "width")).fold(0.0f64, f64::max);
    let height: f64 = charts.iter().map(|c| attr(c, "height")).sum();
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let mut y = 0.0;
    for c in charts {
        // A nested <svg> is placed by its x/y attributes.
        svg += &c.replacen("<svg ", &format!("<svg x=\"0\" y=\"{y}\" "), 1);
        y += attr(c, "height");
    }
    svg += "</svg>\n";
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_and_escape_labels() {
        let svg = grouped_bars(
            "t<1>",
            " ms",
            &["p50", "p99"],
            &[("a&b".into(), vec![1.0, 2.0]), ("c".into(), vec![0.5, 0.0])],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("t&lt;1&gt;") && svg.contains("a&amp;b"));
        // The largest value spans the whole plot width (720 - 150 - 80 = 490).
        assert!(svg.contains("width=\"490.0\""), "{svg}");
        assert!(svg.contains("width=\"245.0\""));
        assert_eq!(svg.matches("<rect").count(), 1 + 2 + 4);
    }

    #[test]
    fn stacked_charts_sit_one_below_the_other() {
        let a = grouped_bars("a", "", &["x"], &[("r".into(), vec![1.0])]);
        let b = grouped_bars("b", "", &["x", "y"], &[("r".into(), vec![1.0, 2.0]), ("s".into(), vec![3.0, 4.0])]);
        let s = stack(&[a, b]);
        // Heights: 60 + rows * (series * 14 + 10) + 30.
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"280\""), "{s}");
        assert!(s.contains("<svg x=\"0\" y=\"0\" ") && s.contains("<svg x=\"0\" y=\"114\" "), "{s}");
        assert_eq!(s.matches("<svg").count(), 3);
        assert_eq!(s.matches("</svg>").count(), 3);
    }

    #[test]
    fn counts_are_whole_numbers_and_the_rest_three_decimals_at_most() {
        assert_eq!(number(48.0), "48");
        assert_eq!(number(0.9153), "0.915");
        assert_eq!(number(12.5), "12.5");
        assert_eq!(number(-0.0001), "0");
        let svg = grouped_bars("t", "", &["n"], &[("a".into(), vec![48.0])]);
        assert!(svg.contains(">48</text>") && !svg.contains("48.000"), "{svg}");
    }
}
