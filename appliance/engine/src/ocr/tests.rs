//! The real models (fetched by `packaging/dev.sh setup` into `.care-dev/ocr`, path in CARE_OCR_MODELS) on a page
//! rendered with a CJK font (`tests/bench/ocr_pages.py --fixture`).

use super::*;

fn models() -> OcrModels {
    let dir = std::env::var_os("CARE_OCR_MODELS").map(PathBuf::from).expect(
        "CARE_OCR_MODELS must name the folder of rapidocr-onnxruntime 1.4.4's models (packaging/dev.sh setup fetches them)",
    );
    OcrModels::load(&dir, &ModelConfig::default(), 2).unwrap()
}

fn fixture() -> (RgbImage, Vec<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let page = image::open(dir.join("ocr-page.png")).unwrap().to_rgb8();
    let text = std::fs::read_to_string(dir.join("ocr-page.txt")).unwrap();
    (page, text.lines().map(str::to_string).collect())
}

fn edits(a: &str, b: &str) -> usize {
    edit_distance(&a.chars().collect::<Vec<_>>(), &b.chars().collect::<Vec<_>>())
}

/// Character error rate of `read` against `truth`, white space ignored (the renderer's cell gaps are not text).
fn cer(read: &[String], truth: &[String]) -> f64 {
    let squeeze = |lines: &[String]| lines.concat().chars().filter(|c| !c.is_whitespace()).collect::<String>();
    let (r, t) = (squeeze(read), squeeze(truth));
    edits(&r, &t) as f64 / t.chars().count() as f64
}

#[test]
fn a_rendered_package_insert_is_read_line_by_line_in_order_and_upside_down_too() {
    let mut ocr = models();
    let (page, truth) = fixture();
    let lines = ocr.read_page(&page).unwrap();
    let read: Vec<String> = lines.iter().map(|l| l.text.clone()).collect();
    let upright = cer(&read, &truth);
    assert!(upright <= 0.03, "CER {upright:.3}: {read:?}");
    assert_eq!(read.len(), truth.len(), "one line per printed line, the table's cells on one: {read:?}");
    assert!(lines.iter().all(|l| l.confidence > 0.5 && l.confidence <= 1.0));
    // The heading's box is where it was drawn (x 60, y 40, 44 px high).
    let b = lines[0].bounds();
    assert!(b[0] < 70.0 && b[1] < 60.0 && b[3] > 80.0 && b[3] < 120.0, "{b:?}");

    let turned = image::imageops::rotate180(&page);
    let read: Vec<String> = ocr.read_page(&turned).unwrap().into_iter().map(|l| l.text).collect();
    let rate = cer(&read, &truth);
    assert!(rate <= 0.03, "upside down: CER {rate:.3}: {read:?}");
}

#[test]
fn pages_beyond_the_pixel_bound_are_refused_in_chinese_and_tiny_ones_hold_nothing() {
    let mut ocr = models();
    let huge = RgbImage::new(8000, 6000);
    let err = ocr.read_page(&huge).unwrap_err().to_string();
    assert!(err.contains("超过上限"), "{err}");
    assert!(ocr.read_page(&RgbImage::new(4, 4)).unwrap().is_empty());
    assert!(ocr.read_page(&RgbImage::from_pixel(300, 200, image::Rgb([255, 255, 255]))).unwrap().is_empty());
}

#[test]
fn edit_distance_counts_characters() {
    assert_eq!(edits("糖尿病", "糖尿病"), 0);
    assert_eq!(edits("糖尿病", "糖尿"), 1);
    assert_eq!(edits("二甲双胍", "二甲双瓜"), 1);
    assert_eq!(edits("", "abc"), 3);
}

/// The sessions run where `device` says, and say where: `auto` on a machine without a working GPU is the CPU, and
/// `cuda` there fails naming why instead of reading on the CPU unnoticed. (On a GPU machine: `auto` and `cuda` are
/// CUDA, and read the same page.)
#[test]
fn the_models_run_on_the_device_asked_for_and_cuda_never_falls_back_silently() {
    let dir = PathBuf::from(std::env::var("CARE_OCR_MODELS").expect("CARE_OCR_MODELS"));
    let on = |device: &str| OcrModels::load(&dir, &ModelConfig { device: device.into(), ..Default::default() }, 2);
    assert_eq!(on("cpu").unwrap().device(), "cpu");
    let cfg = ModelConfig::default();
    match crate::encoders::probe_cuda(&cfg).unwrap() {
        Ok(()) if crate::encoders::gpu_present() => {
            let (mut cuda, (page, truth)) = (on("cuda").unwrap(), fixture());
            assert_eq!((on("auto").unwrap().device(), cuda.device()), ("cuda", "cuda"));
            let read: Vec<String> = cuda.read_page(&page).unwrap().into_iter().map(|l| l.text).collect();
            assert!(cer(&read, &truth) < 0.02, "{read:?}");
        }
        _ => {
            assert_eq!(on("auto").unwrap().device(), "cpu");
            let e = on("cuda").unwrap_err();
            assert!(matches!(e, Error::CudaUnavailable(_)), "{e}");
        }
    }
}
