//! Each line cut from the page, turned upright, and read: the direction classifier says whether a line is upside
//! down (a page scanned the wrong way round), the recognition model gives a distribution over the dictionary at
//! each step across the line, read greedily as CTC (repeats merged, blanks dropped). RapidOCR's sizes and batches.

use image::RgbImage;
use image::imageops::FilterType;

use super::{StepResult, planes};

const HEIGHT: u32 = 48;
const CLS_WIDTH: u32 = 192;
/// The narrowest batch the recogniser is given (RapidOCR's `rec_img_shape` 48 × 320).
const REC_MIN_WIDTH: u32 = 320;
/// The widest line image read, in pixels at height 48 (a line 100 times as long as it is high).
const REC_MAX_WIDTH: u32 = 4800;
const BATCH: usize = 6;
const CLS_THRESHOLD: f32 = 0.9;

/// The rectangle `corners` (clockwise from the top left) cut out of `page` and straightened; a region much taller
/// than wide (a vertical line of text) is turned a quarter to the left.
pub(super) fn crop(page: &RgbImage, corners: &[[f32; 2]; 4]) -> RgbImage {
    let dist = |a: [f32; 2], b: [f32; 2]| ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2)).sqrt();
    let [p0, p1, p2, p3] = *corners;
    let w = dist(p0, p1).max(dist(p3, p2)).round().max(1.0) as u32;
    let h = dist(p0, p3).max(dist(p1, p2)).round().max(1.0) as u32;
    let (ux, uy) = ((p1[0] - p0[0]) / w as f32, (p1[1] - p0[1]) / w as f32);
    let (vx, vy) = ((p3[0] - p0[0]) / h as f32, (p3[1] - p0[1]) / h as f32);
    let out = RgbImage::from_fn(w, h, |x, y| {
        let (fx, fy) = (x as f32 + 0.5, y as f32 + 0.5);
        sample(page, p0[0] + fx * ux + fy * vx - 0.5, p0[1] + fx * uy + fy * vy - 0.5)
    });
    if h as f32 / w as f32 >= 1.5 { image::imageops::rotate270(&out) } else { out }
}

/// Bilinear sample at (x, y), the border repeated outside the page.
fn sample(img: &RgbImage, x: f32, y: f32) -> image::Rgb<u8> {
    let (mw, mh) = (img.width() as i64 - 1, img.height() as i64 - 1);
    let (x0, y0) = (x.floor(), y.floor());
    let (ax, ay) = (x - x0, y - y0);
    let px = |xi: i64, yi: i64| img.get_pixel(xi.clamp(0, mw) as u32, yi.clamp(0, mh) as u32).0;
    let (x0, y0) = (x0 as i64, y0 as i64);
    let (a, b, c, d) = (px(x0, y0), px(x0 + 1, y0), px(x0, y0 + 1), px(x0 + 1, y0 + 1));
    image::Rgb(std::array::from_fn(|i| {
        let top = f32::from(a[i]) * (1.0 - ax) + f32::from(b[i]) * ax;
        let bottom = f32::from(c[i]) * (1.0 - ax) + f32::from(d[i]) * ax;
        (top * (1.0 - ay) + bottom * ay).round().clamp(0.0, 255.0) as u8
    }))
}

/// `img` at the models' height, as wide as its proportions say up to `max_width`.
fn at_height(img: &RgbImage, max_width: u32) -> RgbImage {
    let ratio = img.width() as f32 / img.height().max(1) as f32;
    let w = ((HEIGHT as f32 * ratio).ceil() as u32).clamp(1, max_width);
    image::imageops::resize(img, w, HEIGHT, FilterType::Triangle)
}

/// Turns the lines the classifier finds upside down (with at least [`CLS_THRESHOLD`]) the right way up; returns
/// how many it turned.
pub(super) fn turn_upside_down(session: &mut ort::session::Session, crops: &mut [RgbImage]) -> StepResult<usize> {
    let mut turned = 0;
    for start in (0..crops.len()).step_by(BATCH) {
        let end = (start + BATCH).min(crops.len());
        let sized: Vec<RgbImage> = crops[start..end].iter().map(|c| at_height(c, CLS_WIDTH)).collect();
        let input = planes(&sized.iter().collect::<Vec<_>>(), HEIGHT, CLS_WIDTH);
        let outputs = session.run(ort::inputs![ort::value::TensorRef::from_array_view(input.view())?])?;
        let probs = outputs[0].try_extract_array::<f32>()?;
        for (i, crop) in crops[start..end].iter_mut().enumerate() {
            if probs[[i, 1]] > probs[[i, 0]] && probs[[i, 1]] >= CLS_THRESHOLD {
                image::imageops::rotate180_in_place(crop);
                turned += 1;
            }
        }
    }
    Ok(turned)
}

/// (text, confidence) of each line, in the order given; lines of like proportions are read together.
pub(super) fn read(
    session: &mut ort::session::Session,
    chars: &[String],
    crops: &[RgbImage],
) -> StepResult<Vec<(String, f32)>> {
    let ratio = |c: &RgbImage| c.width() as f32 / c.height().max(1) as f32;
    let mut order: Vec<usize> = (0..crops.len()).collect();
    order.sort_by(|&a, &b| ratio(&crops[a]).total_cmp(&ratio(&crops[b])));
    let mut out = vec![(String::new(), 0.0); crops.len()];
    for batch in order.chunks(BATCH) {
        let widest = batch.iter().map(|&i| ratio(&crops[i])).fold(REC_MIN_WIDTH as f32 / HEIGHT as f32, f32::max);
        let width = ((HEIGHT as f32 * widest) as u32).min(REC_MAX_WIDTH);
        let sized: Vec<RgbImage> = batch.iter().map(|&i| at_height(&crops[i], width)).collect();
        let input = planes(&sized.iter().collect::<Vec<_>>(), HEIGHT, width);
        let outputs = session.run(ort::inputs![ort::value::TensorRef::from_array_view(input.view())?])?;
        let probs = outputs[0].try_extract_array::<f32>()?;
        for (row, &i) in batch.iter().enumerate() {
            out[i] = ctc_greedy(probs.index_axis(ndarray::Axis(0), row), chars);
        }
    }
    Ok(out)
}

/// The best class at each step, repeats merged and blanks (class 0) dropped; the confidence is the mean
/// probability of the characters kept.
fn ctc_greedy(steps: ndarray::ArrayViewD<'_, f32>, chars: &[String]) -> (String, f32) {
    let (mut text, mut sum, mut n, mut previous) = (String::new(), 0.0f32, 0usize, 0usize);
    for step in steps.outer_iter() {
        let (best, p) = step.iter().enumerate().fold((0, f32::MIN), |b, (k, &p)| if p > b.1 { (k, p) } else { b });
        if best != 0
            && best != previous
            && let Some(c) = chars.get(best)
        {
            text.push_str(c);
            sum += p;
            n += 1;
        }
        previous = best;
    }
    (text, if n == 0 { 0.0 } else { sum / n as f32 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctc_merges_repeats_drops_blanks_and_keeps_a_doubled_character_split_by_a_blank() {
        let chars: Vec<String> = ["", "糖", "尿", "病", " "].iter().map(|s| s.to_string()).collect();
        // 糖 糖 _ 尿 病 _ 病 : 糖尿病病
        let best = [1, 1, 0, 2, 3, 0, 3];
        let steps =
            ndarray::Array2::from_shape_fn((best.len(), chars.len()), |(t, k)| if best[t] == k { 0.8 } else { 0.05 });
        let (text, confidence) = ctc_greedy(steps.into_dyn().view(), &chars);
        assert_eq!(text, "糖尿病病");
        assert!((confidence - 0.8).abs() < 1e-6);
    }

    #[test]
    fn a_tilted_rectangle_is_cut_out_straight() {
        // A page with a dark bar along a 2° slope; the cut along the same slope is dark throughout its middle row.
        let angle = 2f32.to_radians();
        let page = RgbImage::from_fn(400, 200, |x, y| {
            let (dx, dy) = (x as f32 - 200.0, y as f32 - 100.0);
            let b = -dx * angle.sin() + dy * angle.cos();
            if b.abs() <= 6.0 && dx.abs() <= 150.0 { image::Rgb([0, 0, 0]) } else { image::Rgb([255, 255, 255]) }
        });
        let (c, s) = (angle.cos(), angle.sin());
        let at = |a: f32, b: f32| [200.0 + a * c - b * s, 100.0 + a * s + b * c];
        let cut = crop(&page, &[at(-140.0, -10.0), at(140.0, -10.0), at(140.0, 10.0), at(-140.0, 10.0)]);
        assert_eq!((cut.width(), cut.height()), (280, 20));
        let middle = (0..cut.width()).filter(|&x| cut.get_pixel(x, 10).0[0] < 64).count();
        assert!(middle >= 276, "{middle} of 280 dark");
        let edge = (0..cut.width()).filter(|&x| cut.get_pixel(x, 0).0[0] < 64).count();
        assert!(edge <= 4, "{edge} dark at the edge");
    }
}
