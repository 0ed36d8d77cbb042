//! Reading order: columns left to right, within a column top to bottom, and the pieces of one row (the cells of a
//! table row, a label and its value) left to right on one line.

use super::OcrLine;

/// `lines` in reading order, each row's pieces joined into one line (cells separated by a space).
pub(super) fn reading_order(lines: Vec<OcrLine>) -> Vec<OcrLine> {
    let mut out = Vec::with_capacity(lines.len());
    for column in columns(lines) {
        out.extend(rows(column));
    }
    out
}

/// Lines split into columns at vertical gaps no line crosses, each gap wider than a line is high; a page without
/// such a gap is one column. Lines wider than half the page (a heading over both columns) belong to no column and
/// split the page into bands, read in turn.
fn columns(mut lines: Vec<OcrLine>) -> Vec<Vec<OcrLine>> {
    if lines.is_empty() {
        return Vec::new();
    }
    lines.sort_by(|a, b| a.bounds()[1].total_cmp(&b.bounds()[1]));
    let left = lines.iter().map(|l| l.bounds()[0]).fold(f32::INFINITY, f32::min);
    let right = lines.iter().map(|l| l.bounds()[2]).fold(f32::NEG_INFINITY, f32::max);
    let spans_page = |l: &OcrLine| {
        let b = l.bounds();
        b[2] - b[0] > (right - left) / 2.0
    };
    let mut out = Vec::new();
    let mut band: Vec<OcrLine> = Vec::new();
    for line in lines {
        if spans_page(&line) {
            out.extend(split_band(std::mem::take(&mut band)));
            out.push(vec![line]);
        } else {
            band.push(line);
        }
    }
    out.extend(split_band(band));
    out
}

/// One band's lines by column.
fn split_band(band: Vec<OcrLine>) -> Vec<Vec<OcrLine>> {
    if band.is_empty() {
        return Vec::new();
    }
    let height = {
        let mut hs: Vec<f32> = band.iter().map(|l| l.bounds()[3] - l.bounds()[1]).collect();
        hs.sort_by(f32::total_cmp);
        hs[hs.len() / 2]
    };
    let mut spans: Vec<(f32, f32)> = band.iter().map(|l| (l.bounds()[0], l.bounds()[2])).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Gaps between merged horizontal extents.
    let mut cuts = Vec::new();
    let mut reach = spans[0].1;
    for &(start, end) in &spans[1..] {
        if start - reach > height {
            cuts.push((reach + start) / 2.0);
        }
        reach = reach.max(end);
    }
    let mut out: Vec<Vec<OcrLine>> = vec![Vec::new(); cuts.len() + 1];
    for line in band {
        let centre = (line.bounds()[0] + line.bounds()[2]) / 2.0;
        out[cuts.iter().filter(|&&c| c < centre).count()].push(line);
    }
    // Columns hold running text, lines many characters long; short pieces apart are a table's cells (or a form's
    // labels and values), read row by row across the gaps.
    let running_text = |column: &Vec<OcrLine>| {
        let mut widths: Vec<f32> = column.iter().map(|l| l.bounds()[2] - l.bounds()[0]).collect();
        widths.sort_by(f32::total_cmp);
        widths[widths.len() / 2] >= COLUMN_LINE_HEIGHTS * height
    };
    out.retain(|c| !c.is_empty());
    if out.len() > 1 && !out.iter().all(running_text) {
        return vec![out.into_iter().flatten().collect()];
    }
    out
}

/// How many line heights wide a column's lines are at the least (about eight characters).
const COLUMN_LINE_HEIGHTS: f32 = 8.0;

/// A column's lines top to bottom, those whose vertical middles lie within half a line of each other read as one
/// row, left to right.
fn rows(mut column: Vec<OcrLine>) -> Vec<OcrLine> {
    let middle = |l: &OcrLine| (l.bounds()[1] + l.bounds()[3]) / 2.0;
    column.sort_by(|a, b| middle(a).total_cmp(&middle(b)));
    let mut out: Vec<Vec<OcrLine>> = Vec::new();
    for line in column {
        let joins = out.last().is_some_and(|row| {
            let last = &row[row.len() - 1];
            let half = (last.bounds()[3] - last.bounds()[1]).min(line.bounds()[3] - line.bounds()[1]) / 2.0;
            (middle(&line) - middle(last)).abs() <= half
        });
        match out.last_mut() {
            Some(row) if joins => row.push(line),
            _ => out.push(vec![line]),
        }
    }
    out.into_iter().map(join_row).collect()
}

fn join_row(mut row: Vec<OcrLine>) -> OcrLine {
    row.sort_by(|a, b| a.bounds()[0].total_cmp(&b.bounds()[0]));
    if row.len() == 1 {
        return row.pop().unwrap_or_else(|| unreachable!());
    }
    let chars: usize = row.iter().map(|l| l.text.chars().count()).sum();
    let confidence =
        row.iter().map(|l| l.confidence * l.text.chars().count() as f32).sum::<f32>() / chars.max(1) as f32;
    let b = row.iter().fold([f32::INFINITY, f32::INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY], |b, l| {
        let x = l.bounds();
        [b[0].min(x[0]), b[1].min(x[1]), b[2].max(x[2]), b[3].max(x[3])]
    });
    let text = row.iter().map(|l| l.text.as_str()).collect::<Vec<_>>().join(" ");
    OcrLine { text, confidence, corners: [[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]]] }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str, x0: f32, y0: f32, x1: f32, y1: f32) -> OcrLine {
        OcrLine { text: text.into(), confidence: 0.9, corners: [[x0, y0], [x1, y0], [x1, y1], [x0, y1]] }
    }

    #[test]
    fn two_columns_under_a_heading_are_read_column_by_column_and_table_cells_stay_on_their_row() {
        let lines = vec![
            line("右一", 520.0, 100.0, 900.0, 130.0),
            line("左二", 50.0, 140.0, 450.0, 170.0),
            line("标题横跨两栏", 50.0, 20.0, 900.0, 60.0),
            line("左一", 50.0, 100.0, 450.0, 130.0),
            line("右二", 520.0, 140.0, 900.0, 170.0),
            // Under a line across the page, a table row: three cells apart, the middle one a little higher.
            line("表1 用法用量（横跨两栏）", 50.0, 240.0, 900.0, 270.0),
            line("二甲双胍", 50.0, 300.0, 200.0, 330.0),
            line("0.5g", 400.0, 297.0, 470.0, 327.0),
            line("每日两次", 700.0, 300.0, 850.0, 330.0),
        ];
        let text: Vec<String> = reading_order(lines).into_iter().map(|l| l.text).collect();
        assert_eq!(
            text,
            ["标题横跨两栏", "左一", "左二", "右一", "右二", "表1 用法用量（横跨两栏）", "二甲双胍 0.5g 每日两次"]
        );
    }
}
