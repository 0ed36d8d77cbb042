//! ZIP archives of documents (folders zipped on Windows, often with GBK-encoded names).
//!
//! The whole central directory is vetted before any member is decompressed: an entry whose name would escape the
//! archive's folder (`..`, absolute paths, drive letters, NUL), a symbolic link, more entries than allowed, a
//! member whose declared compression ratio or the archive's declared total exceeds the limits — each rejects the
//! whole archive as unsafe, since such an archive was made on purpose. Reads are then bounded by the declared sizes,
//! so an archive that lies in its headers cannot expand past them. Members are parsed like uploaded files; a
//! malformed member is reported on its own (`bundle.zip/dir/member.pdf`) while the others are ingested. Nested
//! archives are expanded up to `max_archive_depth` within the same budgets. Metadata junk (`__MACOSX/`, dot files,
//! Thumbs.db) is skipped.

use std::io::{Cursor, Read};
use std::path::Path;

use zip::ZipArchive;

use super::meta::DocMeta;
use super::{FileKind, IngestLimits, IngestOptions, Origin, Unit, parse_origin};
use crate::error::{Error, Result};

struct Budget {
    entries: usize,
    expanded: u64,
}

pub(super) fn expand(origin: &Origin, bytes: &[u8], opts: &IngestOptions, limits: &IngestLimits) -> Result<Vec<Unit>> {
    let mut out = Vec::new();
    let mut budget = Budget { entries: 0, expanded: 0 };
    expand_into(origin, bytes, opts, limits, 1, &mut budget, &mut out)?;
    if out.is_empty() {
        return Err(Error::EmptyFile { path: origin.path.clone() });
    }
    Ok(out)
}

/// An archive read in place from the upload's bytes (never copied: a 1 GiB upload must not cost 2 GiB).
pub(super) type Zip<'a> = ZipArchive<Cursor<&'a [u8]>>;

/// Below this expanded size a member (or a whole archive) is not held to the ratio limit: small real files can
/// compress far better than 100:1 (a blank form, a page of table borders), and however many of them an archive holds,
/// `max_archive_entries` × this stays within `max_expanded_bytes`. Above it, a ratio beyond the limit is refused:
/// real documents compress 3–30:1, zip bombs ~1000:1.
const RATIO_SLACK: u64 = 64 << 10;

/// True when `packed` bytes declared to expand to `size` exceed the ratio limit (beyond the slack).
fn over_ratio(size: u64, packed: u64, limits: &IngestLimits) -> bool {
    size > RATIO_SLACK && size / packed.max(1) > limits.max_expansion_ratio
}

pub(super) fn open<'a>(path: &Path, bytes: &'a [u8], format: &'static str) -> Result<Zip<'a>> {
    ZipArchive::new(Cursor::new(bytes)).map_err(|e| Error::MalformedFile {
        path: path.to_path_buf(),
        format,
        message: format!(
            "not a readable zip archive ({e}){}",
            if format == "DOCX" { "; save it again as .docx from Word or WPS" } else { "" }
        ),
    })
}

fn unsafe_archive(path: &Path, reason: String) -> Error {
    Error::UnsafeArchive { path: path.to_path_buf(), reason }
}

/// The member name as text: UTF-8 when it is, else GB18030 (Windows zips in China), with `\` as `/`.
fn member_name(raw: &[u8]) -> String {
    let s = match std::str::from_utf8(raw) {
        Ok(s) => s.to_string(),
        Err(_) => encoding_rs::GB18030.decode_without_bom_handling(raw).0.into_owned(),
    };
    s.replace('\\', "/")
}

fn unsafe_name(name: &str) -> Option<&'static str> {
    if name.contains('\0') {
        return Some("contains a NUL character");
    }
    if name.starts_with('/') {
        return Some("is an absolute path");
    }
    let b = name.as_bytes();
    if b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':' {
        return Some("starts with a drive letter");
    }
    if name.split('/').any(|c| c == "..") {
        return Some("climbs out of the archive folder with '..' (path traversal)");
    }
    None
}

fn is_junk(name: &str) -> bool {
    name.split('/').any(|c| c.starts_with('.') || c == "__MACOSX")
        || matches!(name.rsplit('/').next(), Some("Thumbs.db" | "desktop.ini"))
}

/// Checks the central directory of an archive against the limits without decompressing anything.
fn vet(path: &Path, zip: &mut Zip<'_>, packed_total: u64, limits: &IngestLimits, budget: &mut Budget) -> Result<()> {
    budget.entries += zip.len();
    if budget.entries > limits.max_archive_entries {
        return Err(unsafe_archive(
            path,
            format!("it holds more than {} entries (ingest.limits.max_archive_entries)", limits.max_archive_entries),
        ));
    }
    let mut declared = 0u64;
    for i in 0..zip.len() {
        let f = zip.by_index_raw(i).map_err(|e| Error::MalformedFile {
            path: path.to_path_buf(),
            format: "ZIP",
            message: format!("entry {i}: {e}"),
        })?;
        let name = member_name(f.name_raw());
        if let Some(why) = unsafe_name(&name) {
            return Err(unsafe_archive(
                path,
                format!("entry {name:?} {why}; the archive was rejected, nothing in it was read"),
            ));
        }
        if f.is_symlink() {
            return Err(unsafe_archive(path, format!("entry {name:?} is a symbolic link; the archive was rejected")));
        }
        if f.is_dir() {
            continue;
        }
        let (size, packed) = (f.size(), f.compressed_size());
        if over_ratio(size, packed, limits) {
            return Err(unsafe_archive(
                path,
                format!(
                    "entry {name:?} expands {packed} bytes to {size} bytes (ratio {}:1, over the limit of {}:1); \
                     this looks like a zip bomb and was not decompressed",
                    size / packed.max(1),
                    limits.max_expansion_ratio
                ),
            ));
        }
        declared = declared.saturating_add(size);
    }
    // Many members each under the slack: the archive as a whole is held to the same ratio (its own size, headers
    // included, is the denominator, which only errs towards accepting).
    if over_ratio(declared, packed_total, limits) {
        return Err(unsafe_archive(
            path,
            format!(
                "its {packed_total} bytes expand to {declared} bytes (ratio {}:1, over the limit of {}:1); this looks \
                 like a zip bomb and was not decompressed",
                declared / packed_total.max(1),
                limits.max_expansion_ratio
            ),
        ));
    }
    budget.expanded = budget.expanded.saturating_add(declared);
    if budget.expanded > limits.max_expanded_bytes {
        return Err(unsafe_archive(
            path,
            format!(
                "it would expand to more than {} bytes (ingest.limits.max_expanded_bytes); split the archive",
                limits.max_expanded_bytes
            ),
        ));
    }
    Ok(())
}

/// Reads member `i`, never more than its declared size (a member whose data exceeds its header is refused).
fn read_member(path: &Path, zip: &mut Zip<'_>, i: usize, name: &str) -> Result<Vec<u8>> {
    let member_path = path.join(name);
    let malformed = |m: String| Error::MalformedFile { path: member_path.clone(), format: "ZIP member", message: m };
    let f = zip.by_index(i).map_err(|e| malformed(e.to_string()))?;
    let declared = f.size();
    let mut buf = Vec::with_capacity(declared.min(64 << 20) as usize);
    f.take(declared + 1).read_to_end(&mut buf).map_err(|e| malformed(format!("cannot decompress: {e}")))?;
    if buf.len() as u64 > declared {
        return Err(unsafe_archive(path, format!("entry {name:?} holds more data than its header declares")));
    }
    Ok(buf)
}

/// Reads a named member (for DOCX parts), within the same ratio and size limits.
pub(super) fn read_named(
    path: &Path,
    zip: &mut Zip<'_>,
    name: &str,
    limits: &IngestLimits,
    format: &'static str,
) -> Result<Option<Vec<u8>>> {
    let Some(i) = zip.index_for_name(name) else { return Ok(None) };
    let (size, packed) = {
        let f = zip.by_index_raw(i).map_err(|e| Error::MalformedFile {
            path: path.to_path_buf(),
            format,
            message: e.to_string(),
        })?;
        (f.size(), f.compressed_size())
    };
    if size > limits.max_file_bytes || over_ratio(size, packed, limits) {
        return Err(unsafe_archive(
            path,
            format!(
                "part {name:?} expands {packed} bytes to {size} bytes, over the limits; this looks like a zip bomb"
            ),
        ));
    }
    read_member(path, zip, i, name).map(Some).map_err(|e| {
        if let Error::MalformedFile { message, .. } = e {
            Error::MalformedFile { path: path.to_path_buf(), format, message }
        } else {
            e
        }
    })
}

fn expand_into(
    origin: &Origin,
    bytes: &[u8],
    opts: &IngestOptions,
    limits: &IngestLimits,
    depth: usize,
    budget: &mut Budget,
    out: &mut Vec<Unit>,
) -> Result<()> {
    let path = &origin.path;
    let mut zip = open(path, bytes, "ZIP")?;
    vet(path, &mut zip, bytes.len() as u64, limits, budget)?;
    let mut members: Vec<(usize, String)> = Vec::new();
    for i in 0..zip.len() {
        let f = zip.by_index_raw(i).map_err(|e| Error::MalformedFile {
            path: path.clone(),
            format: "ZIP",
            message: e.to_string(),
        })?;
        let name = member_name(f.name_raw());
        if f.is_dir() || is_junk(&name) {
            continue;
        }
        members.push((i, name));
    }
    for (i, name) in members {
        let member = Origin { path: path.join(&name), ident: format!("{}/{}", origin.ident, name) };
        let unit_name = member.path.display().to_string();
        let kind = match FileKind::of(Path::new(&name)) {
            Ok(k) => k,
            Err(_) => {
                let ext = Path::new(&name).extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
                out.push(Unit { name: unit_name, result: Err(Error::UnsupportedFormat { path: member.path, ext }) });
                continue;
            }
        };
        let data = match read_member(path, &mut zip, i, &name) {
            Ok(d) => d,
            Err(e @ Error::UnsafeArchive { .. }) => return Err(e),
            Err(e) => {
                out.push(Unit { name: unit_name, result: Err(e) });
                continue;
            }
        };
        if data.len() as u64 > limits.max_file_bytes {
            out.push(Unit {
                name: unit_name.clone(),
                result: Err(Error::TooLarge {
                    what: unit_name,
                    size: data.len() as u64,
                    limit: limits.max_file_bytes,
                    hint: "split it into smaller files".into(),
                }),
            });
            continue;
        }
        if kind == FileKind::Zip {
            if depth >= limits.max_archive_depth {
                return Err(unsafe_archive(
                    path,
                    format!("archives nest deeper than {} levels (at {name:?})", limits.max_archive_depth),
                ));
            }
            match expand_into(&member, &data, opts, limits, depth + 1, budget, out) {
                Ok(()) => {}
                Err(e @ Error::UnsafeArchive { .. }) => return Err(e),
                Err(e) => out.push(Unit { name: unit_name, result: Err(e) }),
            }
            continue;
        }
        // The member's folders (outer archives' too) may name its department, type and year.
        let folders = DocMeta::from_folders(member.ident.rsplit_once('/').map_or("", |(dirs, _)| dirs).split('/'));
        let opts = IngestOptions { meta: folders.or(&opts.meta), ..opts.clone() };
        out.push(Unit { name: unit_name, result: parse_origin(&member, kind, &data, &opts, limits) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::fixtures::zip_bytes;

    fn units(bytes: &[u8], limits: &IngestLimits) -> Result<Vec<Unit>> {
        expand(&Origin::of_file(Path::new("up/bundle.zip")), bytes, &IngestOptions::default(), limits)
    }

    #[test]
    fn members_are_parsed_and_reported_one_by_one() {
        let (gb, _, _) = encoding_rs::GB18030.encode("编号,问题\n1,发热怎么办？\n");
        let inner = zip_bytes(&[("deep/c.md", "# 哮喘\n吸入激素。".as_bytes())]);
        let z = zip_bytes(&[
            ("指南/a.txt", "高血压患者应限盐。".as_bytes()),
            ("指南/bank.csv", &gb),
            ("指南/broken.jsonl", b"{not json"),
            ("img/x.gif", b"GIF89a"),
            ("__MACOSX/._a.txt", b"junk"),
            ("nested.zip", &inner),
        ]);
        let u = units(&z, &IngestLimits::default()).unwrap();
        let names: Vec<&str> = u.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "up/bundle.zip/指南/a.txt",
                "up/bundle.zip/指南/bank.csv",
                "up/bundle.zip/指南/broken.jsonl",
                "up/bundle.zip/img/x.gif",
                "up/bundle.zip/nested.zip/deep/c.md"
            ]
        );
        let a = u[0].result.as_ref().unwrap();
        assert_eq!(a.documents[0].external_id, "bundle.zip/指南/a.txt");
        assert_eq!(u[1].result.as_ref().unwrap().documents[0].text, "发热怎么办？");
        assert_eq!(u[2].result.as_ref().unwrap_err().code().as_str(), "malformed_record");
        assert_eq!(u[3].result.as_ref().unwrap_err().code().as_str(), "unsupported_format");
        assert_eq!(u[4].result.as_ref().unwrap().documents[0].external_id, "bundle.zip/nested.zip/deep/c.md");
        // Folders name the type; nothing else says more.
        assert_eq!(a.documents[0].meta.doc_type, "指南");
        assert_eq!(u[4].result.as_ref().unwrap().documents[0].meta, DocMeta::default());
    }

    #[test]
    fn folders_give_department_type_and_year_and_the_upload_form_fills_the_rest() {
        let z = zip_bytes(&[
            ("心内科/2021/指南/a.txt", "高血压患者应限盐。".as_bytes()),
            ("护理部/b.jsonl", "{\"text\":\"翻身\",\"类型\":\"护理规范\",\"date\":\"2023/5/12\"}\n".as_bytes()),
            ("c.csv", "text,科室,日期\n胸痛,急诊科,2022年3月\n".as_bytes()),
            ("d.jsonl", "{\"text\":\"x\",\"date\":\"2023-13-01\"}\n".as_bytes()),
        ]);
        let form = DocMeta { department: "医务部".into(), doc_type: "制度".into(), ..Default::default() };
        let opts = IngestOptions { meta: form, ..Default::default() };
        let u = expand(&Origin::of_file(Path::new("up/bundle.zip")), &z, &opts, &IngestLimits::default()).unwrap();
        let meta = |i: usize| u[i].result.as_ref().unwrap().documents[0].meta.clone();
        let m = |d: &str, t: &str, y: &str| DocMeta {
            department: d.into(),
            doc_type: t.into(),
            date: y.into(),
            ..Default::default()
        };
        assert_eq!(meta(0), m("心内科", "指南", "2021"));
        assert_eq!(meta(1), m("护理部", "护理规范", "2023-05-12"));
        assert_eq!(meta(2), m("急诊科", "制度", "2022-03"));
        let e = u[3].result.as_ref().unwrap_err();
        assert_eq!(e.code().as_str(), "malformed_record");
        assert!(e.to_string().contains("2023-13-01"), "{e}");
    }

    #[test]
    fn traversal_bombs_and_entry_counts_are_refused_whole() {
        for bad in ["../etc/passwd.txt", "/abs.txt", "C:/win.txt", "a/../../b.txt", "..\\x.txt"] {
            let z = zip_bytes(&[("ok.txt", "好".as_bytes()), (bad, "坏".as_bytes())]);
            let err = units(&z, &IngestLimits::default()).unwrap_err();
            assert_eq!(err.code().as_str(), "unsafe_archive", "{bad}: {err}");
        }
        let zeros = vec![0u8; 8 << 20];
        let z = zip_bytes(&[("bomb.txt", &zeros)]);
        assert!(z.len() < 64 << 10);
        let err = units(&z, &IngestLimits::default()).unwrap_err();
        assert!(err.to_string().contains("zip bomb") && err.to_string().contains("over the limit of 100:1"), "{err}");
        let many: Vec<(String, Vec<u8>)> = (0..20).map(|i| (format!("{i}.txt"), b"x".to_vec())).collect();
        let refs: Vec<(&str, &[u8])> = many.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        let limits = IngestLimits { max_archive_entries: 10, ..Default::default() };
        let err = units(&zip_bytes(&refs), &limits).unwrap_err();
        assert!(err.to_string().contains("more than 10 entries"), "{err}");
        let err = units(b"PK\x03\x04 truncated", &IngestLimits::default()).unwrap_err();
        assert_eq!(err.code().as_str(), "malformed_record", "{err}");
    }

    #[test]
    fn small_bombs_are_refused_small_compressible_files_are_not() {
        // The review's case: a 2.3 KB archive of members under 1 MiB each, expanding ~1000:1 in all.
        let filler = vec![b'a'; 750_000];
        let z = zip_bytes(&[("a.txt", &filler), ("b.txt", &filler), ("c.txt", &filler)]);
        assert!(z.len() < 4 << 10, "{} bytes", z.len());
        let err = units(&z, &IngestLimits::default()).unwrap_err();
        assert_eq!(err.code().as_str(), "unsafe_archive", "{err}");
        assert!(err.to_string().contains("zip bomb"), "{err}");
        // Each member under the slack, the archive as a whole ~1000:1.
        let small = vec![b' '; 60 << 10];
        let names: Vec<String> = (0..300).map(|i| format!("{i}.txt")).collect();
        let many: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), small.as_slice())).collect();
        let err = units(&zip_bytes(&many), &IngestLimits::default()).unwrap_err();
        assert_eq!(err.code().as_str(), "unsafe_archive", "{err}");
        assert!(err.to_string().contains("over the limit of 100:1"), "{err}");
        // A real small file that compresses past 100:1 (a form of blank lines and rules) is still read.
        let form = format!("# 护理记录单\n{}", "——————————\n\n".repeat(1500));
        let z = zip_bytes(&[("form.md", form.as_bytes())]);
        assert!(form.len() as u64 / z.len() as u64 > 100, "{} -> {}", form.len(), z.len());
        let u = units(&z, &IngestLimits::default()).unwrap();
        assert_eq!(u[0].result.as_ref().unwrap().documents[0].title, "护理记录单");
    }
}
