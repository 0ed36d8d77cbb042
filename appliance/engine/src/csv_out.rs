//! The one CSV writer every export goes through (search analytics, the synonym table, the audit log, any later
//! one), so CSV injection is handled in one place and quoting is done once.
//!
//! A cell that a spreadsheet would read as a formula (OWASP's rule: first character `=`, `+`, `-`, `@`, tab or
//! carriage return) gets a leading `'`, which Excel, WPS and LibreOffice take as "this is text" and do not show.
//! Then RFC 4180 quoting: a cell with a comma, a quote, a line break or leading/trailing whitespace is quoted, inner
//! quotes doubled. Rows end with CRLF (RFC 4180). Numbers the code itself writes ([`Cell::Int`], [`Cell::Num`]) are
//! not user text and stay numbers, so a spreadsheet can sum a column of counts.
//!
//! [`restore`] is the exact inverse of the neutralising step, for an import that reads back what an export wrote
//! (the synonym table): export → import is the identity for every text.

use std::borrow::Cow;
use std::fmt::Write as _;

/// The characters after which a spreadsheet evaluates a cell (OWASP "CSV Injection"): a formula (`=`), an
/// arithmetic or DDE expression (`+cmd|' /C calc'!A0`, `-2+3`), a Lotus-style function (`@SUM(1)`).
const FORMULA: [char; 4] = ['=', '+', '-', '@'];

/// Texts a spreadsheet would run, in the forms that hide them (a quoted one, behind a space, a tab or a carriage
/// return, with a comma inside): what the exports' tests plant wherever user text reaches an export, in this
/// crate's tests and over HTTP.
pub const FORMULA_PAYLOADS: [&str; 9] = [
    r#"=HYPERLINK("http://x","y")"#,
    "+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(1)",
    "\t=1",
    "\r=1",
    " =1",
    "=1,2",
    "\"=1,2\"",
];

/// One cell of a row: text from a person or the data (neutralised and quoted as needed), or a number the code
/// computed (written as it is: a negative count or score is no formula and must stay a number).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cell<'a> {
    Text(&'a str),
    Int(i64),
    /// Written with Rust's shortest round-trip form; NaN and infinities as an empty cell (no spreadsheet reads
    /// `inf`, and `-inf` would be parsed as a formula).
    Num(f64),
}

impl<'a> From<&'a str> for Cell<'a> {
    fn from(s: &'a str) -> Self {
        Cell::Text(s)
    }
}

impl<'a> From<&'a String> for Cell<'a> {
    fn from(s: &'a String) -> Self {
        Cell::Text(s)
    }
}

impl From<i64> for Cell<'_> {
    fn from(n: i64) -> Self {
        Cell::Int(n)
    }
}

impl From<usize> for Cell<'_> {
    fn from(n: usize) -> Self {
        Cell::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<u32> for Cell<'_> {
    fn from(n: u32) -> Self {
        Cell::Int(i64::from(n))
    }
}

impl From<f64> for Cell<'_> {
    fn from(n: f64) -> Self {
        Cell::Num(n)
    }
}

/// A CSV document being written; [`CsvOut::finish`] returns it. Writing to memory cannot fail.
#[derive(Debug, Default)]
pub struct CsvOut {
    out: String,
}

impl CsvOut {
    /// Without a byte-order mark (files read back by programs: the synonym table, the audit log's export).
    pub fn new() -> Self {
        CsvOut::default()
    }

    /// With a UTF-8 byte-order mark, without which Excel opens UTF-8 Chinese as mojibake.
    pub fn with_bom() -> Self {
        CsvOut { out: String::from('\u{feff}') }
    }

    /// A header row (text the code chose; neutralised all the same, so no caller has to think about it).
    pub fn header(&mut self, names: &[&str]) -> &mut Self {
        self.row(names.iter().map(|n| Cell::Text(n)))
    }

    /// One row of cells, each neutralised and quoted by [`cell`] (text) or written as a number.
    pub fn row<'a>(&mut self, cells: impl IntoIterator<Item = Cell<'a>>) -> &mut Self {
        for (i, c) in cells.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            match c {
                Cell::Text(s) => self.out.push_str(&cell(s)),
                Cell::Int(n) => {
                    let _ = write!(self.out, "{n}");
                }
                Cell::Num(x) if x.is_finite() => {
                    let _ = write!(self.out, "{x}");
                }
                Cell::Num(_) => {}
            }
        }
        self.out.push_str("\r\n");
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Whether a spreadsheet could run `s` as a formula: its first character is `=`, `+`, `-` or `@`, or tab or CR
/// (OWASP's list). Leading whitespace and apostrophes are looked through: LibreOffice's and others' CSV import can
/// trim spaces ("Trim spaces"), which turns ` =1+1` into `=1+1`; and a text that already starts with `'` followed
/// by a formula (`'=1`) must get one more, or [`restore`] could not tell it from a neutralised `=1`.
fn is_formula(s: &str) -> bool {
    let lead = s.trim_start_matches(|c: char| c == '\'' || c.is_whitespace());
    let skipped = &s[..s.len() - lead.len()];
    skipped.contains(['\t', '\r']) || lead.starts_with(FORMULA)
}

/// `s` with a leading `'` when a spreadsheet could run it as a formula ([`is_formula`]), unchanged otherwise.
pub fn neutralise(s: &str) -> Cow<'_, str> {
    if is_formula(s) { Cow::Owned(format!("'{s}")) } else { Cow::Borrowed(s) }
}

/// The inverse of [`neutralise`], for a cell read back by an import: exactly one leading `'` is removed, and only
/// where [`neutralise`] would have added it. A text of its own starting with `'` keeps it.
pub fn restore(s: &str) -> &str {
    match s.strip_prefix('\'') {
        Some(rest) if is_formula(rest) => rest,
        _ => s,
    }
}

/// One text cell as it is written: neutralised, then quoted once (RFC 4180) when it holds a comma, a quote or a
/// line break, or begins or ends with whitespace (which some readers trim away).
pub fn cell(s: &str) -> Cow<'_, str> {
    let s = neutralise(s);
    let edges = s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace);
    if edges || s.contains([',', '"', '\r', '\n']) { Cow::Owned(format!("\"{}\"", s.replace('"', "\"\""))) } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cells of `text` as the `csv` crate (a real RFC 4180 reader) reads them.
    fn parse(text: &str) -> Vec<Vec<String>> {
        let mut r = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
        r.records().map(|rec| rec.unwrap().iter().map(str::to_string).collect()).collect()
    }

    #[test]
    fn csv_cell_neutralises_every_formula_prefix() {
        for p in ["=", "+", "-", "@", "\t", "\r"] {
            let s = format!("{p}1+1");
            let c = cell(&s);
            let read = &parse(&format!("{c}\r\n"))[0][0];
            assert_eq!(*read, format!("'{s}"), "{s:?} written as {c:?}");
        }
        // Plain text, Chinese, an apostrophe of its own, a number-looking text: unchanged, unquoted.
        for s in ["心肌梗死", "COPD", "it's", "12", "a-b", "a=b", ""] {
            assert_eq!(cell(s), s);
        }
    }

    #[test]
    fn csv_cell_quotes_once_and_neutralises_inside_the_quotes() {
        // A comma and a formula: the apostrophe goes inside the quotes, where the reader sees it first.
        assert_eq!(cell("=1,2"), "\"'=1,2\"");
        assert_eq!(cell(r#"=HYPERLINK("http://x","y")"#), r#""'=HYPERLINK(""http://x"",""y"")""#);
        // Quotes doubled, line breaks kept inside quotes, nothing quoted twice.
        assert_eq!(cell("说 \"是\""), "\"说 \"\"是\"\"\"");
        assert_eq!(cell("一\n二"), "\"一\n二\"");
        assert_eq!(cell("\r=1"), "\"'\r=1\"");
        // Leading whitespace before a formula: neutralised (a trimming reader would otherwise run it); behind the
        // apostrophe the whitespace no longer leads, so no quotes are needed.
        assert_eq!(cell(" =1"), "' =1");
        assert_eq!(cell("\t=1"), "'\t=1");
        assert_eq!(cell("  trailing "), "\"  trailing \"");
        let payloads = ["=1,2", "\"=1,2\"", "-2+3\n=3", "a,\"b\"\r\nc", " =1", "@SUM(1)", "+cmd|' /C calc'!A0"];
        for s in payloads {
            let read = parse(&format!("{},x\r\n", cell(s)));
            assert_eq!(read[0].len(), 2, "{s:?} stays one cell");
            assert_eq!(restore(&read[0][0]), s, "{s:?} reads back");
            assert!(!read[0][0].starts_with(['=', '+', '-', '@', '\t', '\r']), "{s:?} → {:?}", read[0][0]);
        }
    }

    #[test]
    fn csv_numbers_stay_numbers_and_rows_end_with_crlf() {
        let mut w = CsvOut::new();
        w.header(&["项目", "值"]).row([Cell::from("差值"), Cell::from(-3i64)]).row(["得分".into(), Cell::Num(-0.5)]);
        w.row([Cell::from("无穷"), Cell::Num(f64::NEG_INFINITY)]).row([Cell::from("计数"), Cell::from(7usize)]);
        assert_eq!(w.finish(), "项目,值\r\n差值,-3\r\n得分,-0.5\r\n无穷,\r\n计数,7\r\n");
        assert!(CsvOut::with_bom().finish().starts_with('\u{feff}'));
    }

    #[test]
    fn csv_restore_inverts_neutralise_exactly() {
        let texts = ["=1", "'=1", "''=1", "' =1", "'", "it's", "'abc", "\t", "'\tabc", " -x", "-", "plain", "'@"];
        for s in texts {
            assert_eq!(restore(&neutralise(s)), s, "{s:?}");
        }
        // What a spreadsheet writes back when it saves the file (the apostrophe dropped) reads as the same text.
        assert_eq!(restore("=1"), "=1");
    }
}
