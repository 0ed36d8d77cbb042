//! Text lines found on a page by DBNet: the model gives each pixel the probability that it lies inside text; the
//! pixels above [`THRESHOLD`] (dilated by one) form the lines, each taken as its smallest rotated rectangle (so a
//! page scanned 1–3° askew still yields one line per rectangle), kept when the mean probability inside is at least
//! [`BOX_THRESHOLD`], and grown by [`UNCLIP_RATIO`] (the model was trained on shrunk lines). RapidOCR's constants.

use image::RgbImage;
use image::imageops::FilterType;

use super::{DET_MAX_SIDE, StepResult, planes};

const THRESHOLD: f32 = 0.3;
const BOX_THRESHOLD: f32 = 0.5;
const UNCLIP_RATIO: f32 = 1.6;
/// The detector's input is scaled up until its shorter side has this many pixels (RapidOCR's `limit_side_len`).
const MIN_SIDE: u32 = 736;
const MAX_CANDIDATES: usize = 1000;

#[derive(Debug, Clone)]
pub(super) struct Region {
    /// Clockwise from the top left, in page pixels.
    pub corners: [[f32; 2]; 4],
}

/// The detector's input size for a page: at most [`DET_MAX_SIDE`] and at least [`MIN_SIDE`] a side where that does
/// not break the first bound, in multiples of 32.
fn input_size(width: u32, height: u32) -> (u32, u32) {
    let (w, h) = (width as f32, height as f32);
    let mut ratio = (DET_MAX_SIDE as f32 / w.max(h)).min(1.0);
    if w.min(h) * ratio < MIN_SIDE as f32 {
        ratio = (MIN_SIDE as f32 / w.min(h)).min(DET_MAX_SIDE as f32 / w.max(h)).max(ratio);
    }
    let to32 = |v: f32| {
        let n = (((v * ratio) / 32.0).round() as u32).max(1) * 32;
        if n > DET_MAX_SIDE { n - 32 } else { n }
    };
    (to32(w), to32(h))
}

pub(super) fn regions(session: &mut ort::session::Session, page: &RgbImage) -> StepResult<Vec<Region>> {
    let (w, h) = input_size(page.width(), page.height());
    let scaled = image::imageops::resize(page, w, h, FilterType::Triangle);
    let input = planes(&[&scaled], h, w);
    let outputs = session.run(ort::inputs![ort::value::TensorRef::from_array_view(input.view())?])?;
    let prob = outputs[0].try_extract_array::<f32>()?;
    let prob = prob.to_shape((h as usize, w as usize)).map_err(|e| ort::Error::new(e.to_string()))?.to_owned();
    let (sx, sy) = (page.width() as f32 / w as f32, page.height() as f32 / h as f32);
    Ok(boxes(&prob)
        .into_iter()
        .map(|corners| {
            let page_corner = |[x, y]: [f32; 2]| {
                [(x * sx).clamp(0.0, page.width() as f32), (y * sy).clamp(0.0, page.height() as f32)]
            };
            Region { corners: corners.map(page_corner) }
        })
        .collect())
}

/// The rotated rectangles of text in a probability map, in its pixels.
fn boxes(prob: &ndarray::Array2<f32>) -> Vec<[[f32; 2]; 4]> {
    let (h, w) = prob.dim();
    // Dilated by a 2 × 2 kernel anchored at its bottom right, as OpenCV's dilate with RapidOCR's kernel.
    let above = |y: usize, x: usize| prob[[y, x]] > THRESHOLD;
    let mut mask = vec![false; h * w];
    for y in 0..h {
        for x in 0..w {
            mask[y * w + x] = above(y, x)
                || (y > 0 && above(y - 1, x))
                || (x > 0 && above(y, x - 1))
                || (y > 0 && x > 0 && above(y - 1, x - 1));
        }
    }
    let mut out = Vec::new();
    for component in components(&mut mask, w, h).into_iter().take(MAX_CANDIDATES) {
        let hull = convex_hull(&component);
        let Some(rect) = min_area_rect(&hull) else { continue };
        if rect.w.min(rect.h) < 3.0 {
            continue;
        }
        if mean_inside(prob, &rect) < BOX_THRESHOLD {
            continue;
        }
        let grow = rect.w * rect.h * UNCLIP_RATIO / (2.0 * (rect.w + rect.h));
        let rect = Rect { w: rect.w + 2.0 * grow, h: rect.h + 2.0 * grow, ..rect };
        if rect.w.min(rect.h) < 5.0 {
            continue;
        }
        out.push(rect.corners());
    }
    out
}

/// For each 8-connected component of `mask` (cleared as it is read): each row's leftmost and rightmost pixel
/// centres, enough for its convex hull.
fn components(mask: &mut [bool], w: usize, h: usize) -> Vec<Vec<[f32; 2]>> {
    let mut out = Vec::new();
    let mut stack = Vec::new();
    for start in 0..mask.len() {
        if !mask[start] {
            continue;
        }
        mask[start] = false;
        stack.push(start);
        let mut rows: std::collections::BTreeMap<usize, (usize, usize)> = Default::default();
        while let Some(i) = stack.pop() {
            let (y, x) = (i / w, i % w);
            let e = rows.entry(y).or_insert((x, x));
            e.0 = e.0.min(x);
            e.1 = e.1.max(x);
            for dy in [-1i64, 0, 1] {
                for dx in [-1i64, 0, 1] {
                    let (ny, nx) = (y as i64 + dy, x as i64 + dx);
                    if ny >= 0 && nx >= 0 && (ny as usize) < h && (nx as usize) < w {
                        let j = ny as usize * w + nx as usize;
                        if mask[j] {
                            mask[j] = false;
                            stack.push(j);
                        }
                    }
                }
            }
        }
        out.push(rows.into_iter().flat_map(|(y, (a, b))| [[a as f32, y as f32], [b as f32, y as f32]]).collect());
    }
    out
}

fn cross(o: [f32; 2], a: [f32; 2], b: [f32; 2]) -> f32 {
    (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
}

/// Andrew's monotone chain, counter-clockwise, without repeated points.
fn convex_hull(points: &[[f32; 2]]) -> Vec<[f32; 2]> {
    let mut p = points.to_vec();
    p.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])));
    p.dedup();
    if p.len() < 3 {
        return p;
    }
    let mut hull: Vec<[f32; 2]> = Vec::with_capacity(2 * p.len());
    for pass in [p.clone(), p.into_iter().rev().collect()] {
        let floor = hull.len();
        for q in pass {
            while hull.len() >= floor + 2 && cross(hull[hull.len() - 2], hull[hull.len() - 1], q) <= 0.0 {
                hull.pop();
            }
            hull.push(q);
        }
        hull.pop();
    }
    hull
}

/// A rectangle: centre, the unit vector along its width, width and height.
#[derive(Debug, Clone, Copy)]
struct Rect {
    c: [f32; 2],
    u: [f32; 2],
    w: f32,
    h: f32,
}

impl Rect {
    /// Corners clockwise from the top left (image coordinates: y grows downwards).
    fn corners(&self) -> [[f32; 2]; 4] {
        // The width runs along whichever of u and its normal is the more horizontal one.
        let (u, w, h) = if self.u[0].abs() >= self.u[1].abs() {
            (self.u, self.w, self.h)
        } else {
            ([self.u[1], -self.u[0]], self.h, self.w)
        };
        let u = if u[0] < 0.0 { [-u[0], -u[1]] } else { u };
        let v = [-u[1], u[0]]; // points down when u points right
        let at = |a: f32, b: f32| {
            [self.c[0] + a * u[0] * w / 2.0 + b * v[0] * h / 2.0, self.c[1] + a * u[1] * w / 2.0 + b * v[1] * h / 2.0]
        };
        [at(-1.0, -1.0), at(1.0, -1.0), at(1.0, 1.0), at(-1.0, 1.0)]
    }

    fn contains(&self, p: [f32; 2]) -> bool {
        let d = [p[0] - self.c[0], p[1] - self.c[1]];
        let a = d[0] * self.u[0] + d[1] * self.u[1];
        let b = -d[0] * self.u[1] + d[1] * self.u[0];
        a.abs() <= self.w / 2.0 + 0.5 && b.abs() <= self.h / 2.0 + 0.5
    }
}

/// The smallest rectangle holding a convex hull: one of its sides lies on a hull edge (rotating calipers, tried
/// edge by edge; a line's hull has few points).
fn min_area_rect(hull: &[[f32; 2]]) -> Option<Rect> {
    if hull.is_empty() {
        return None;
    }
    if hull.len() < 3 {
        let (a, b) = (hull[0], hull[hull.len() - 1]);
        let len = ((b[0] - a[0]).powi(2) + (b[1] - a[1]).powi(2)).sqrt();
        let u = if len > 0.0 { [(b[0] - a[0]) / len, (b[1] - a[1]) / len] } else { [1.0, 0.0] };
        return Some(Rect { c: [(a[0] + b[0]) / 2.0, (a[1] + b[1]) / 2.0], u, w: len + 1.0, h: 1.0 });
    }
    let mut best: Option<(f32, Rect)> = None;
    for i in 0..hull.len() {
        let (a, b) = (hull[i], hull[(i + 1) % hull.len()]);
        let len = ((b[0] - a[0]).powi(2) + (b[1] - a[1]).powi(2)).sqrt();
        if len == 0.0 {
            continue;
        }
        let u = [(b[0] - a[0]) / len, (b[1] - a[1]) / len];
        let (mut lo_u, mut hi_u, mut lo_v, mut hi_v) = (f32::MAX, f32::MIN, f32::MAX, f32::MIN);
        for p in hull {
            let pu = p[0] * u[0] + p[1] * u[1];
            let pv = -p[0] * u[1] + p[1] * u[0];
            (lo_u, hi_u, lo_v, hi_v) = (lo_u.min(pu), hi_u.max(pu), lo_v.min(pv), hi_v.max(pv));
        }
        // Pixel centres span one pixel less than the pixels do.
        let (w, h) = (hi_u - lo_u + 1.0, hi_v - lo_v + 1.0);
        let (mu, mv) = ((lo_u + hi_u) / 2.0, (lo_v + hi_v) / 2.0);
        let c = [mu * u[0] - mv * u[1], mu * u[1] + mv * u[0]];
        if best.is_none_or(|(area, _)| w * h < area) {
            best = Some((w * h, Rect { c, u, w, h }));
        }
    }
    best.map(|b| b.1)
}

/// The mean probability inside a rectangle (RapidOCR's "fast" box score).
fn mean_inside(prob: &ndarray::Array2<f32>, rect: &Rect) -> f32 {
    let (h, w) = prob.dim();
    let corners = rect.corners();
    let lo = |i: usize| corners.iter().map(|c| c[i]).fold(f32::INFINITY, f32::min).floor().max(0.0) as usize;
    let hi = |i: usize, n: usize| {
        (corners.iter().map(|c| c[i]).fold(f32::NEG_INFINITY, f32::max).ceil() as usize).min(n - 1)
    };
    let (mut sum, mut n) = (0.0f64, 0usize);
    for y in lo(1)..=hi(1, h) {
        for x in lo(0)..=hi(0, w) {
            if rect.contains([x as f32, y as f32]) {
                sum += f64::from(prob[[y, x]]);
                n += 1;
            }
        }
    }
    if n == 0 { 0.0 } else { (sum / n as f64) as f32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tilted_bar_is_one_rectangle_at_its_angle_grown_by_the_unclip_distance() {
        // A bar 200 × 10 pixels turned by 2°, as a line of a page scanned askew.
        let (w, h) = (300, 120);
        let angle = 2f32.to_radians();
        let prob = ndarray::Array2::from_shape_fn((h, w), |(y, x)| {
            let (dx, dy) = (x as f32 - 150.0, y as f32 - 60.0);
            let (a, b) = (dx * angle.cos() + dy * angle.sin(), -dx * angle.sin() + dy * angle.cos());
            if a.abs() <= 100.0 && b.abs() <= 5.0 { 0.9 } else { 0.0 }
        });
        let found = boxes(&prob);
        assert_eq!(found.len(), 1, "{found:?}");
        let [tl, tr, br, bl] = found[0];
        let slope = (tr[1] - tl[1]) / (tr[0] - tl[0]);
        assert!((slope.atan().to_degrees() - 2.0).abs() < 0.5, "angle {}", slope.atan().to_degrees());
        assert!(tl[0] < tr[0] && tl[1] < bl[1] && br[1] > tr[1], "clockwise from the top left: {:?}", found[0]);
        let width = ((tr[0] - tl[0]).powi(2) + (tr[1] - tl[1]).powi(2)).sqrt();
        let height = ((bl[0] - tl[0]).powi(2) + (bl[1] - tl[1]).powi(2)).sqrt();
        // The dilation adds a pixel; unclip adds 2 × area × 1.6 / perimeter ≈ 15.4 to each side.
        let grow = 202.0 * 12.0 * 1.6 / (2.0 * 214.0);
        assert!((width - (202.0 + 2.0 * grow)).abs() < 4.0, "width {width}");
        assert!((height - (12.0 + 2.0 * grow)).abs() < 4.0, "height {height}");
    }

    #[test]
    fn faint_regions_and_specks_are_not_lines() {
        let mut prob = ndarray::Array2::<f32>::zeros((100, 100));
        prob.slice_mut(ndarray::s![10..20, 10..80]).fill(0.35); // above the threshold, mean below the box score
        prob.slice_mut(ndarray::s![50..51, 50..52]).fill(0.9); // a speck
        assert!(boxes(&prob).is_empty());
    }

    #[test]
    fn input_sizes_are_bounded_and_multiples_of_32() {
        assert_eq!(input_size(1654, 2339), (1408, 1984)); // A4 at 200 dpi
        assert_eq!(input_size(400, 300), (992, 736)); // a small photo is scaled up
        assert_eq!(input_size(100, 4000), (64, 1984)); // a long strip stays within the longer bound
        let (w, h) = input_size(1, 1);
        assert!(w >= 32 && h >= 32);
    }
}
