//! Vector kernels with run-time CPU dispatch.
//!
//! The release binary is built for baseline x86-64 (SSE2) so one `.deb` runs on every hospital workstation; the
//! exact scan is memory-bound only when it uses the widest loads the CPU has, so the ISA is picked once at run
//! time (AVX-512F, AVX2 + FMA, NEON on aarch64) and the portable loop is the fallback. Every kernel sums in the
//! same lane order within its ISA, so a score does not depend on where a row sits in the matrix.

use std::sync::OnceLock;

/// The instruction set the kernels use on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Neon,
    Portable,
}

/// The CPU's model name as Linux reports it ("unknown" elsewhere), for reports beside the vector ISA.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into())
}

impl Isa {
    /// The best instruction set this CPU supports (detected once; `CARE_KERNELS=portable` forces the fallback,
    /// for comparison and for tests).
    pub fn detected() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            if std::env::var("CARE_KERNELS").is_ok_and(|v| v == "portable") {
                return Isa::Portable;
            }
            detect()
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512f",
            Isa::Avx2 => "avx2+fma",
            Isa::Neon => "neon",
            Isa::Portable => "portable",
        }
    }
}

/// What this CPU offers ONNX Runtime for an int8 query encoder's matrix products, which decides whether the int8
/// graph is worth serving: with a dot-product instruction on 8-bit integers (AVX-512 VNNI, AVX-VNNI, Arm's dot
/// product) int8 encodes about three times as fast as fp32; with AVX2 alone it saves little.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Int8Support {
    Avx512Vnni,
    AvxVnni,
    ArmDotProd,
    /// 8-bit products widened in AVX2 registers: correct, modestly faster than fp32.
    Avx2,
    None,
}

impl Int8Support {
    /// Read from the flags Linux reports for the first CPU (`/proc/cpuinfo`); `None` where they cannot be read.
    pub fn detected() -> Int8Support {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags: Vec<&str> = info
            .lines()
            .find(|l| l.starts_with("flags") || l.starts_with("Features"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.split_whitespace().collect())
            .unwrap_or_default();
        Self::from_flags(&flags)
    }

    pub fn from_flags(flags: &[&str]) -> Int8Support {
        let has = |f: &str| flags.contains(&f);
        if has("avx512_vnni") {
            Int8Support::Avx512Vnni
        } else if has("avx_vnni") {
            Int8Support::AvxVnni
        } else if has("asimddp") {
            Int8Support::ArmDotProd
        } else if has("avx2") {
            Int8Support::Avx2
        } else {
            Int8Support::None
        }
    }

    /// Whether int8 encoding is markedly faster than fp32 here.
    pub fn fast(self) -> bool {
        matches!(self, Int8Support::Avx512Vnni | Int8Support::AvxVnni | Int8Support::ArmDotProd)
    }

    pub fn label_zh(self) -> &'static str {
        match self {
            Int8Support::Avx512Vnni => "AVX-512 VNNI：int8 查询编码约比 fp32 快 3 倍",
            Int8Support::AvxVnni => "AVX-VNNI：int8 查询编码明显快于 fp32",
            Int8Support::ArmDotProd => "Arm 点积指令：int8 查询编码明显快于 fp32",
            Int8Support::Avx2 => "仅 AVX2（无 VNNI）：int8 查询编码只比 fp32 略快",
            Int8Support::None => "无 int8 点积指令：int8 查询编码不比 fp32 快",
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    if std::arch::is_x86_feature_detected!("avx512f") {
        Isa::Avx512
    } else if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        Isa::Avx2
    } else {
        Isa::Portable
    }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Isa {
    Isa::Neon
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Isa {
    Isa::Portable
}

/// Inner product over the common length of `a` and `b`.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    if n == 0 {
        return 0.0;
    }
    let mut out = [0f32];
    scores_with(Isa::detected(), &a[..n], &b[..n], &mut out);
    out[0]
}

/// `out[i]` = inner product of row `i` of the row-major matrix `rows` (width `q.len()`) with `q`.
pub fn scores(rows: &[f32], q: &[f32], out: &mut [f32]) {
    scores_with(Isa::detected(), rows, q, out);
}

/// [`scores`] on a chosen instruction set (it must be one [`Isa::detected`] allows, or the portable one).
pub fn scores_with(isa: Isa, rows: &[f32], q: &[f32], out: &mut [f32]) {
    let w = q.len();
    assert!(w > 0 && rows.len() == out.len() * w, "{} values are not {} rows of width {w}", rows.len(), out.len());
    match isa {
        // SAFETY: the ISA was detected on this CPU (callers may only pass a detected one or Portable).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if std::arch::is_x86_feature_detected!("avx512f") => unsafe { x86::scores_avx512(rows, q, out) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") => unsafe {
            x86::scores_avx2(rows, q, out)
        },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::scores(rows, q, out),
        Isa::Avx512 | Isa::Avx2 | Isa::Neon | Isa::Portable => portable(rows, q, out),
    }
}

/// Rows quantised to int8, one symmetric scale per row: a quarter of the bytes of the f32 rows, for a first pass
/// that is bound by memory bandwidth.
pub struct Int8Rows {
    width: usize,
    codes: Vec<i8>,
    scales: Vec<f32>,
    /// Per row, the sum of its codes: the VNNI pass multiplies unsigned query bytes (the int8 query + 128) by the
    /// signed codes, and takes 128 × this sum off again.
    sums: Vec<i32>,
}

impl Int8Rows {
    pub fn quantize(rows: &[f32], width: usize) -> Self {
        let mut codes = Vec::with_capacity(rows.len());
        let mut scales = Vec::with_capacity(rows.len() / width.max(1));
        for row in rows.chunks_exact(width.max(1)) {
            let s = int8_scale(row);
            codes.extend(row.iter().map(|v| to_int8(*v, s)));
            scales.push(s);
        }
        let sums = codes.chunks_exact(width.max(1)).map(|r| r.iter().map(|c| i32::from(*c)).sum()).collect();
        Int8Rows { width, codes, scales, sums }
    }

    pub fn len(&self) -> usize {
        self.scales.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }
}

/// The symmetric int8 scale of a vector: its largest magnitude maps to 127.
fn int8_scale(v: &[f32]) -> f32 {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max > 0.0 { max / 127.0 } else { 1.0 }
}

fn to_int8(v: f32, scale: f32) -> i8 {
    (v / scale).round().clamp(-127.0, 127.0) as i8
}

/// Top-k by exact f32 inner product, found through an int8 first pass: the best `k × oversample` rows by the
/// quantised score are re-scored exactly against `rows` and the best k of those returned. Equal to [`top_k`]
/// whenever the true top k lie among those candidates (the quantisation error is far below the score gaps that
/// matter; `int8_scores_match_the_portable_loop_and_the_scan_finds_the_exact_top_k` and
/// `tests/bench/int8_oversample.py` measure it).
pub fn top_k_int8(approx: &Int8Rows, rows: &[f32], q: &[f32], k: usize, oversample: f32) -> Vec<(f32, usize)> {
    top_k_int8_where(approx, rows, q, k, oversample, |_| true)
}

/// [`top_k_int8`] over the rows `keep` admits only (a search filter): rejected rows never take a place among the
/// candidates, so the k best admitted rows come back however rare they are.
pub fn top_k_int8_where(
    approx: &Int8Rows,
    rows: &[f32],
    q: &[f32],
    k: usize,
    oversample: f32,
    keep: impl Fn(usize) -> bool,
) -> Vec<(f32, usize)> {
    top_k_int8_pair(approx, rows, q, k, oversample, None, keep).1
}

/// One int8 scan, two rankings: the k best of every row (when `all` asks for it: `Some(k)`) and the k best of the rows
/// `keep` admits. A filtered search needs both (the facet counts come from the unfiltered one), and the scan's cost
/// is reading the rows, not ranking them.
pub fn top_k_int8_pair(
    approx: &Int8Rows,
    rows: &[f32],
    q: &[f32],
    k: usize,
    oversample: f32,
    all: Option<usize>,
    keep: impl Fn(usize) -> bool,
) -> (Vec<(f32, usize)>, Vec<(f32, usize)>) {
    let w = q.len();
    let n = approx.len().min(rows.len() / w.max(1));
    if approx.width != w || n == 0 {
        return top_k_pair(rows, q, k, all, keep);
    }
    let m = |k: usize| ((k.min(n) as f32 * oversample.max(1.0)).ceil() as usize).min(n);
    let (mut every, mut kept) = (TopK::new(all.map_or(0, m)), TopK::new(m(k)));
    // With AVX-512 VNNI the query is quantised too and 64 products are summed per instruction (the f32 pass
    // converts every code to a float first: 13 % of a loaded server's CPU). Its extra rounding only reorders
    // candidates, which the exact re-scoring below ranks.
    let vnni = Vnni::for_query(q);
    scan(
        &approx.codes[..n * w],
        w,
        |first, block, out| match &vnni {
            Some(v) => v.scores(block, &approx.sums[first..first + out.len()], out),
            None => scores_i8(block, q, out),
        },
        |row, s| {
            let s = s * approx.scales[row];
            every.offer(s, row);
            if keep(row) {
                kept.offer(s, row);
            }
        },
    );
    let rescore = |best: TopK, k: usize| {
        let mut exact = TopK::new(k);
        for (_, row) in best.heap {
            exact.offer(dot(&rows[row * w..(row + 1) * w], q), row);
        }
        exact.into_sorted()
    };
    (rescore(every, all.unwrap_or(0)), rescore(kept, k))
}

/// The query quantised for the VNNI first pass: unsigned bytes (int8 + 128) and their scale.
struct Vnni {
    q: Vec<u8>,
    scale: f32,
}

impl Vnni {
    /// None when this CPU lacks AVX-512 VNNI (or the width is not a multiple of 64).
    fn for_query(q: &[f32]) -> Option<Vnni> {
        #[cfg(target_arch = "x86_64")]
        if q.len() % 64 == 0
            && Isa::detected() == Isa::Avx512
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            let scale = int8_scale(q);
            let q = q.iter().map(|v| (i32::from(to_int8(*v, scale)) + 128) as u8).collect();
            return Some(Vnni { q, scale });
        }
        let _ = q;
        None
    }

    /// Scores of the rows in `codes` (`sums`: those rows' code sums), unscaled by the rows' own scales, like
    /// [`scores_i8`].
    fn scores(&self, codes: &[i8], sums: &[i32], out: &mut [f32]) {
        assert!(codes.len() == out.len() * self.q.len() && sums.len() == out.len());
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `for_query` returned Some only where AVX-512 VNNI and BW were detected, with a width that is a
        // multiple of 64; the lengths were checked above.
        unsafe {
            x86::dots_vnni(codes, &self.q, out)
        };
        // (q + 128) · c − 128 Σc = q · c
        for (o, sum) in out.iter_mut().zip(sums) {
            *o = (*o - 128.0 * *sum as f32) * self.scale;
        }
    }
}

/// `out[i]` = inner product of int8 row `i` of `codes` with the f32 query `q` (unscaled).
pub fn scores_i8(codes: &[i8], q: &[f32], out: &mut [f32]) {
    let w = q.len();
    assert!(w > 0 && codes.len() == out.len() * w, "{} codes are not {} rows of width {w}", codes.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() == Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected on this CPU.
        return unsafe { x86::scores_i8_avx512(codes, q, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(Isa::detected(), Isa::Avx512 | Isa::Avx2)
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: AVX2 and FMA were detected on this CPU.
        return unsafe { x86::scores_i8_avx2(codes, q, out) };
    }
    for (row, o) in codes.chunks_exact(w).zip(out.iter_mut()) {
        let mut acc = [0f32; 8];
        let (ca, cb) = (row.chunks_exact(8), q.chunks_exact(8));
        let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| f32::from(*x) * y).sum();
        for (x, y) in ca.zip(cb) {
            for i in 0..8 {
                acc[i] += f32::from(x[i]) * y[i];
            }
        }
        *o = acc.iter().sum::<f32>() + tail;
    }
}

/// Exact top-k rows of a row-major matrix by inner product with `q`: (score, row), best first, ties by row.
pub fn top_k(rows: &[f32], q: &[f32], k: usize) -> Vec<(f32, usize)> {
    top_k_where(rows, q, k, |_| true)
}

/// [`top_k`] over the rows `keep` admits only.
pub fn top_k_where(rows: &[f32], q: &[f32], k: usize, keep: impl Fn(usize) -> bool) -> Vec<(f32, usize)> {
    top_k_pair(rows, q, k, None, keep).1
}

/// [`top_k_int8_pair`] on the f32 rows.
pub fn top_k_pair(
    rows: &[f32],
    q: &[f32],
    k: usize,
    all: Option<usize>,
    keep: impl Fn(usize) -> bool,
) -> (Vec<(f32, usize)>, Vec<(f32, usize)>) {
    let w = q.len();
    let n = rows.len() / w.max(1);
    let (mut every, mut kept) = (TopK::new(all.unwrap_or(0).min(n)), TopK::new(k.min(n)));
    if n > 0 {
        scan(
            &rows[..n * w],
            w,
            |_, block, out| scores(block, q, out),
            |row, s| {
                every.offer(s, row);
                if keep(row) {
                    kept.offer(s, row);
                }
            },
        );
    }
    (every.into_sorted(), kept.into_sorted())
}

/// Scores a row-major matrix (width `w`) a block of rows at a time (`score_block` gets the block's first row) and
/// hands each (row, score) to `visit`: the block stays in L1 while the selection reads it back, and the scan never
/// allocates per row.
fn scan<T>(rows: &[T], w: usize, score_block: impl Fn(usize, &[T], &mut [f32]), mut visit: impl FnMut(usize, f32)) {
    const BLOCK: usize = 1024;
    let mut buf = vec![0f32; BLOCK.min(rows.len() / w)];
    for (b, chunk) in rows.chunks(BLOCK * w).enumerate() {
        let out = &mut buf[..chunk.len() / w];
        score_block(b * BLOCK, chunk, out);
        for (i, &s) in out.iter().enumerate() {
            visit(b * BLOCK + i, s);
        }
    }
}

/// The k best (score, row) pairs seen, kept as a min-heap on score so a candidate below the k-th costs one compare.
struct TopK {
    k: usize,
    heap: Vec<(f32, usize)>,
}

impl TopK {
    fn new(k: usize) -> Self {
        TopK { k, heap: Vec::with_capacity(k) }
    }

    /// Worse first: lower score, then the later row (so ties keep the earlier row).
    fn worse(a: (f32, usize), b: (f32, usize)) -> bool {
        a.0 < b.0 || (a.0 == b.0 && a.1 > b.1)
    }

    /// Inlined into the scans' per-row loops: a full heap rejects a row that is not better than its worst with one
    /// compare (nearly every row of a 32,000-row scan for a few hundred candidates); as a call per row it cost 5 %
    /// of a loaded server's CPU.
    #[inline(always)]
    fn offer(&mut self, s: f32, row: usize) {
        if self.heap.len() == self.k && (self.k == 0 || !Self::worse(self.heap[0], (s, row))) {
            return;
        }
        self.insert(s, row);
    }

    /// A row that takes a place: pushed while the heap fills, else in place of the worst.
    #[inline(never)]
    fn insert(&mut self, s: f32, row: usize) {
        if self.heap.len() < self.k {
            self.heap.push((s, row));
            let mut i = self.heap.len() - 1;
            while i > 0 {
                let p = (i - 1) / 2;
                if !Self::worse(self.heap[i], self.heap[p]) {
                    break;
                }
                self.heap.swap(i, p);
                i = p;
            }
        } else {
            self.heap[0] = (s, row);
            self.sift_down();
        }
    }

    fn sift_down(&mut self) {
        let (mut i, n) = (0, self.heap.len());
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && Self::worse(self.heap[l], self.heap[m]) {
                m = l;
            }
            if r < n && Self::worse(self.heap[r], self.heap[m]) {
                m = r;
            }
            if m == i {
                return;
            }
            self.heap.swap(i, m);
            i = m;
        }
    }

    fn into_sorted(mut self) -> Vec<(f32, usize)> {
        self.heap.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        self.heap
    }
}

/// Eight independent accumulators, so the compiler vectorises it for the baseline target without `-ffast-math`.
fn portable(rows: &[f32], q: &[f32], out: &mut [f32]) {
    for (row, o) in rows.chunks_exact(q.len()).zip(out.iter_mut()) {
        let mut acc = [0f32; 8];
        let (ca, cb) = (row.chunks_exact(8), q.chunks_exact(8));
        let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
        for (x, y) in ca.zip(cb) {
            for i in 0..8 {
                acc[i] += x[i] * y[i];
            }
        }
        *o = acc.iter().sum::<f32>() + tail;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Four rows per pass share each load of the query; one accumulator per row keeps four FMA chains in flight.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores_avx512(rows: &[f32], q: &[f32], out: &mut [f32]) {
        // SAFETY: the caller checked the CPU has this target feature; every load stays inside `rows`/`q`.
        unsafe {
            let w = q.len();
            let body = w - w % 16;
            let mut r = 0;
            while r + 4 <= out.len() {
                let base = rows.as_ptr().add(r * w);
                let mut acc = [_mm512_setzero_ps(); 4];
                let mut j = 0;
                while j < body {
                    let qv = _mm512_loadu_ps(q.as_ptr().add(j));
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(_mm512_loadu_ps(base.add(k * w + j)), qv, *a);
                    }
                    j += 16;
                }
                for (k, a) in acc.iter().enumerate() {
                    out[r + k] =
                        _mm512_reduce_add_ps(*a) + tail(&rows[(r + k) * w + body..(r + k + 1) * w], &q[body..]);
                }
                r += 4;
            }
            while r < out.len() {
                let base = rows.as_ptr().add(r * w);
                let mut a = _mm512_setzero_ps();
                let mut j = 0;
                while j < body {
                    a = _mm512_fmadd_ps(_mm512_loadu_ps(base.add(j)), _mm512_loadu_ps(q.as_ptr().add(j)), a);
                    j += 16;
                }
                out[r] = _mm512_reduce_add_ps(a) + tail(&rows[r * w + body..(r + 1) * w], &q[body..]);
                r += 1;
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores_avx2(rows: &[f32], q: &[f32], out: &mut [f32]) {
        // SAFETY: the caller checked the CPU has this target feature; every load stays inside `rows`/`q`.
        unsafe {
            let w = q.len();
            let body = w - w % 8;
            let mut r = 0;
            while r + 4 <= out.len() {
                let base = rows.as_ptr().add(r * w);
                let mut acc = [_mm256_setzero_ps(); 4];
                let mut j = 0;
                while j < body {
                    let qv = _mm256_loadu_ps(q.as_ptr().add(j));
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(_mm256_loadu_ps(base.add(k * w + j)), qv, *a);
                    }
                    j += 8;
                }
                for (k, a) in acc.iter().enumerate() {
                    out[r + k] = hsum256(*a) + tail(&rows[(r + k) * w + body..(r + k + 1) * w], &q[body..]);
                }
                r += 4;
            }
            while r < out.len() {
                let base = rows.as_ptr().add(r * w);
                let mut a = _mm256_setzero_ps();
                let mut j = 0;
                while j < body {
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(base.add(j)), _mm256_loadu_ps(q.as_ptr().add(j)), a);
                    j += 8;
                }
                out[r] = hsum256(a) + tail(&rows[r * w + body..(r + 1) * w], &q[body..]);
                r += 1;
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores_i8_avx512(codes: &[i8], q: &[f32], out: &mut [f32]) {
        // SAFETY: the caller checked AVX-512F; every load reads 16 codes / 16 floats inside `body`.
        unsafe {
            let w = q.len();
            let body = w - w % 16;
            for (r, o) in out.iter_mut().enumerate() {
                let base = codes.as_ptr().add(r * w);
                let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                let mut j = 0;
                while j + 32 <= body {
                    let c0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(base.add(j) as *const __m128i)));
                    let c1 =
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(base.add(j + 16) as *const __m128i)));
                    a0 = _mm512_fmadd_ps(c0, _mm512_loadu_ps(q.as_ptr().add(j)), a0);
                    a1 = _mm512_fmadd_ps(c1, _mm512_loadu_ps(q.as_ptr().add(j + 16)), a1);
                    j += 32;
                }
                while j < body {
                    let c0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(base.add(j) as *const __m128i)));
                    a0 = _mm512_fmadd_ps(c0, _mm512_loadu_ps(q.as_ptr().add(j)), a0);
                    j += 16;
                }
                let row = &codes[r * w..(r + 1) * w];
                *o = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + tail_i8(&row[body..], &q[body..]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores_i8_avx2(codes: &[i8], q: &[f32], out: &mut [f32]) {
        // SAFETY: the caller checked AVX2 and FMA; every load reads 8 codes / 8 floats inside `body`.
        unsafe {
            let w = q.len();
            let body = w - w % 8;
            for (r, o) in out.iter_mut().enumerate() {
                let base = codes.as_ptr().add(r * w);
                let mut a = _mm256_setzero_ps();
                let mut j = 0;
                while j < body {
                    let c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(base.add(j) as *const __m128i)));
                    a = _mm256_fmadd_ps(c, _mm256_loadu_ps(q.as_ptr().add(j)), a);
                    j += 8;
                }
                let row = &codes[r * w..(r + 1) * w];
                *o = hsum256(a) + tail_i8(&row[body..], &q[body..]);
            }
        }
    }

    /// `out[i]` = (unsigned query bytes) · (int8 row `i`), as f32 (exact: |sum| < 2^24 for widths up to 512).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dots_vnni(codes: &[i8], q: &[u8], out: &mut [f32]) {
        // SAFETY: the caller checked the features, that q.len() is a multiple of 64 and codes holds out.len() rows.
        unsafe {
            let w = q.len();
            for (r, o) in out.iter_mut().enumerate() {
                let base = codes.as_ptr().add(r * w);
                let mut acc = _mm512_setzero_si512();
                let mut j = 0;
                while j < w {
                    let a = _mm512_loadu_si512(q.as_ptr().add(j) as *const _);
                    let b = _mm512_loadu_si512(base.add(j) as *const _);
                    acc = _mm512_dpbusd_epi32(acc, a, b);
                    j += 64;
                }
                *o = _mm512_reduce_add_epi32(acc) as f32;
            }
        }
    }

    fn tail_i8(a: &[i8], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| f32::from(*x) * y).sum()
    }

    #[target_feature(enable = "avx2")]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    fn tail(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    pub fn scores(rows: &[f32], q: &[f32], out: &mut [f32]) {
        let w = q.len();
        let body = w - w % 4;
        for (r, o) in out.iter_mut().enumerate() {
            let row = &rows[r * w..(r + 1) * w];
            // SAFETY: NEON is part of the aarch64 baseline; every load reads 4 floats inside `body`.
            let s = unsafe {
                let mut a = vdupq_n_f32(0.0);
                let mut j = 0;
                while j < body {
                    a = vfmaq_f32(a, vld1q_f32(row.as_ptr().add(j)), vld1q_f32(q.as_ptr().add(j)));
                    j += 4;
                }
                vaddvq_f32(a)
            };
            *o = s + row[body..].iter().zip(&q[body..]).map(|(x, y)| x * y).sum::<f32>();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_support_is_read_from_the_cpu_flags() {
        assert_eq!(Int8Support::from_flags(&["avx2", "avx512f", "avx512_vnni"]), Int8Support::Avx512Vnni);
        assert_eq!(Int8Support::from_flags(&["avx2", "avx_vnni"]), Int8Support::AvxVnni);
        assert_eq!(Int8Support::from_flags(&["fp", "asimd", "asimddp"]), Int8Support::ArmDotProd);
        assert!(!Int8Support::from_flags(&["sse2", "avx2", "fma"]).fast());
        assert_eq!(Int8Support::from_flags(&["sse2"]), Int8Support::None);
    }

    fn matrix(n: usize, w: usize, seed: u32) -> Vec<f32> {
        let mut x = seed;
        (0..n * w)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    fn every_isa_on_this_cpu_agrees_with_f64_sums() {
        // Widths with and without a SIMD tail, row counts with and without a partial group of four.
        for (n, w) in [(1, 1), (3, 7), (9, 384), (13, 385), (64, 1024), (5, 17)] {
            let (rows, q) = (matrix(n, w, 1), matrix(1, w, 2));
            let want: Vec<f64> =
                rows.chunks_exact(w).map(|r| r.iter().zip(&q).map(|(a, b)| *a as f64 * *b as f64).sum()).collect();
            for isa in [Isa::detected(), Isa::Portable] {
                let mut got = vec![0f32; n];
                scores_with(isa, &rows, &q, &mut got);
                for (g, w) in got.iter().zip(&want) {
                    assert!((*g as f64 - w).abs() < 1e-4, "{isa:?} n={n}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn top_k_matches_a_full_sort_across_blocks() {
        let (n, w) = (2500, 48);
        let (rows, q) = (matrix(n, w, 3), matrix(1, w, 4));
        let mut all = vec![0f32; n];
        scores(&rows, &q, &mut all);
        let mut want: Vec<(f32, usize)> = all.iter().copied().zip(0..).collect();
        want.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for k in [1, 10, 100, 1500, n, n + 5] {
            assert_eq!(top_k(&rows, &q, k), want[..k.min(n)], "k={k}");
        }
        assert!(top_k(&[], &q, 3).is_empty());
    }

    #[test]
    fn filtered_scans_return_the_best_admitted_rows_however_rare() {
        let (n, w) = (5000, 64);
        let mut rows = matrix(n, w, 11);
        for r in rows.chunks_exact_mut(w) {
            let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter_mut().for_each(|x| *x /= norm);
        }
        let q = matrix(1, w, 12);
        // One row in 97 admitted: an unfiltered top 100 would hold about one of them.
        let keep = |row: usize| row % 97 == 5;
        let mut want: Vec<(f32, usize)> =
            (0..n).filter(|r| keep(*r)).map(|r| (dot(&rows[r * w..(r + 1) * w], &q), r)).collect();
        want.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let got = top_k_where(&rows, &q, 20, keep);
        assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), want[..20].iter().map(|g| g.1).collect::<Vec<_>>());
        let codes = Int8Rows::quantize(&rows, w);
        let got8 = top_k_int8_where(&codes, &rows, &q, 20, 4.0, keep);
        assert_eq!(got8.iter().map(|g| g.1).collect::<Vec<_>>(), want[..20].iter().map(|g| g.1).collect::<Vec<_>>());
        assert_eq!(top_k_where(&rows, &q, 100, keep).len(), want.len(), "fewer admitted rows than k: all of them");
        // One scan, both rankings: the unfiltered one equals the plain scan's.
        let (every, kept) = top_k_int8_pair(&codes, &rows, &q, 20, 4.0, Some(100), keep);
        assert_eq!(every, top_k_int8(&codes, &rows, &q, 100, 4.0));
        assert_eq!(kept, got8);
        assert_eq!(top_k_pair(&rows, &q, 20, Some(30), keep), (top_k(&rows, &q, 30), got));
    }

    #[test]
    fn int8_scores_match_the_portable_loop_and_the_scan_finds_the_exact_top_k() {
        for (n, w) in [(3, 7), (9, 384), (13, 385), (40, 33)] {
            let (rows, q) = (matrix(n, w, 5), matrix(1, w, 6));
            let codes = Int8Rows::quantize(&rows, w);
            let mut got = vec![0f32; n];
            scores_i8(&codes.codes, &q, &mut got);
            for (r, g) in got.iter().enumerate() {
                let want: f32 = codes.codes[r * w..(r + 1) * w].iter().zip(&q).map(|(c, y)| f32::from(*c) * y).sum();
                assert!((g - want).abs() < 1e-3 * want.abs().max(1.0), "row {r}: {g} vs {want}");
            }
        }
        // Normalised rows, as the dense index holds: the int8 pass with the served oversample returns the exact top k.
        let (n, w) = (3000, 384);
        let mut rows = matrix(n, w, 7);
        for r in rows.chunks_exact_mut(w) {
            let norm = r.iter().map(|v| v * v).sum::<f32>().sqrt();
            r.iter_mut().for_each(|v| *v /= norm);
        }
        let codes = Int8Rows::quantize(&rows, w);
        for seed in 0..5 {
            let q: Vec<f32> = rows[seed * w..(seed + 1) * w]
                .iter()
                .zip(matrix(1, w, 100 + seed as u32))
                .map(|(a, b)| a + 0.05 * b)
                .collect();
            let served = crate::dense::INT8_OVERSAMPLE;
            assert_eq!(top_k_int8(&codes, &rows, &q, 100, served), top_k(&rows, &q, 100), "query {seed}");
        }
    }

    #[test]
    fn the_vnni_pass_agrees_with_the_f32_int8_pass_within_the_query_s_rounding() {
        let (n, w) = (50, 384);
        let (rows, q) = (matrix(n, w, 11), matrix(1, w, 12));
        let codes = Int8Rows::quantize(&rows, w);
        let Some(v) = Vnni::for_query(&q) else {
            eprintln!("no AVX-512 VNNI here: the f32 int8 pass serves (and is what the other tests check)");
            return;
        };
        let (mut got, mut want) = (vec![0f32; n], vec![0f32; n]);
        v.scores(&codes.codes, &codes.sums, &mut got);
        scores_i8(&codes.codes, &q, &mut want);
        // The query's own rounding: at most half a step per component, times the codes' magnitudes.
        let qmax = q.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (r, (g, x)) in got.iter().zip(&want).enumerate() {
            let bound =
                0.5 * qmax / 127.0 * codes.codes[r * w..(r + 1) * w].iter().map(|c| f32::from(*c).abs()).sum::<f32>();
            assert!((g - x).abs() <= bound + 1e-3, "row {r}: {g} vs {x} (bound {bound})");
        }
    }

    #[test]
    fn ties_keep_the_earlier_row() {
        let rows = [1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0, 1.0];
        assert_eq!(top_k(&rows, &[1.0, 0.0], 3), vec![(1.0, 0), (1.0, 2), (0.5, 1)]);
    }
}
