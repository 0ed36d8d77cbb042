//! A loss-per-step line chart as a standalone SVG (raw loss faint, moving average bold).

use std::fmt::Write;

use crate::train::StepMetrics;

pub fn loss_chart(title: &str, metrics: &[StepMetrics], window: usize) -> String {
    let (w, h, ml, mr, mt, mb) = (760.0, 360.0, 60.0, 20.0, 40.0, 40.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        w / 2.0,
        escape(title)
    );
    if metrics.is_empty() {
        s.push_str("</svg>\n");
        return s;
    }
    let max_step = metrics.iter().map(|m| m.step).max().unwrap_or(1).max(1) as f64;
    let lo = metrics.iter().map(|m| m.loss).fold(f64::INFINITY, f64::min).min(0.0);
    let hi = metrics.iter().map(|m| m.loss).fold(f64::NEG_INFINITY, f64::max).max(lo + 1e-6);
    let x = |step: f64| ml + (w - ml - mr) * step / max_step;
    let y = |v: f64| mt + (h - mt - mb) * (1.0 - (v - lo) / (hi - lo));
    for i in 0..=4 {
        let v = lo + (hi - lo) * f64::from(i) / 4.0;
        let yv = y(v);
        let _ = write!(
            s,
            r##"<line x1="{ml}" x2="{}" y1="{yv:.1}" y2="{yv:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.3}</text>"##,
            w - mr,
            ml - 6.0,
            yv + 4.0
        );
    }
    for i in 0..=4 {
        let st = max_step * f64::from(i) / 4.0;
        let _ = write!(s, r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#, x(st), h - mb + 16.0, st.round());
    }
    let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">步数</text>"#, w / 2.0, h - 6.0);
    let raw: Vec<String> = metrics.iter().map(|m| format!("{:.1},{:.1}", x(m.step as f64), y(m.loss))).collect();
    let _ = write!(s, r##"<polyline fill="none" stroke="#9ecae1" stroke-width="1" points="{}"/>"##, raw.join(" "));
    let win = window.max(1);
    let avg: Vec<String> = (0..metrics.len())
        .map(|i| {
            let from = i.saturating_sub(win - 1);
            let mean = metrics[from..=i].iter().map(|m| m.loss).sum::<f64>() / (i - from + 1) as f64;
            format!("{:.1},{:.1}", x(metrics[i].step as f64), y(mean))
        })
        .collect();
    let _ = write!(s, r##"<polyline fill="none" stroke="#08519c" stroke-width="2" points="{}"/>"##, avg.join(" "));
    let _ = write!(
        s,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#08519c">损失（最近 {win} 步的滑动平均）</text></svg>"##,
        w - mr,
        mt + 12.0
    );
    s.push('\n');
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
