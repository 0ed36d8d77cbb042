//! The synonym and abbreviation table, and pinyin initials.
//!
//! Clinicians write COPD, 慢阻肺 and 慢性阻塞性肺疾病 for one disease; passages use one of them. Admins keep groups of
//! equivalent terms (a preferred term and its variants) in SQLite; the project ships a seed table
//! (`assets/synonyms_seed.csv`) loaded once into a new data directory. At query time a term of a group found in
//! the query adds the group's other terms to the BM25 query at a lower weight (`search.synonym_weight`), so the
//! original wording still ranks first and nothing is re-indexed. Every change bumps `synonym_state.version`; each
//! search compares it with the table it holds, so an edit from the console, the API or the CLI (another process)
//! is in force at the next search.
//!
//! An all-letters query that is neither a table term nor a word of the collections is read as pinyin (gxy,
//! gaoxueya → 高血压): its candidates come from the medical dictionary and the table's Chinese terms.

use std::collections::HashMap;

use pinyin::ToPinyinMulti;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::audit;
use crate::csv_out::{self, Cell, CsvOut};
use crate::error::{Error, Result};
use crate::store::{Store, now};
use crate::text::fold;

/// The table the project ships (preferred term, variants separated by `|`, a category).
pub const SEED_CSV: &str = include_str!("../assets/synonyms_seed.csv");
/// Bounds on what an admin (or a file) can make the engine hold and match per query.
pub const MAX_GROUPS: usize = 50_000;
pub const MAX_TERMS_PER_GROUP: usize = 32;
pub const MAX_TERM_CHARS: usize = 40;
pub const MAX_CSV_BYTES: usize = 4 << 20;

/// One group as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SynonymEntry {
    pub id: i64,
    /// The preferred term (首选词).
    pub preferred: String,
    /// Its synonyms and abbreviations.
    pub variants: Vec<String>,
    /// A category or remark (备注).
    pub note: String,
    /// `seed` (shipped), `admin` (typed in) or `import` (CSV).
    pub origin: String,
    pub updated_by: String,
    pub updated_at: String,
}

/// A group as an admin submits it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewSynonym {
    pub preferred: String,
    pub variants: Vec<String>,
    #[serde(default)]
    pub note: String,
}

/// What a CSV import did.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImportReport {
    pub added: usize,
    pub updated: usize,
    /// Groups removed because `replace` was asked for.
    pub removed: usize,
}

fn invalid(msg: String) -> Error {
    Error::InvalidInput(msg)
}

/// Trims and checks one group: terms non-empty, at most [`MAX_TERM_CHARS`], no separator characters, at least two
/// characters (a single character would expand nearly every query), no term twice.
fn clean(g: &NewSynonym) -> Result<NewSynonym> {
    let preferred = g.preferred.trim().to_string();
    let variants: Vec<String> =
        g.variants.iter().flat_map(|v| v.split('|')).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect();
    if preferred.is_empty() {
        return Err(invalid("首选词不能为空".into()));
    }
    if variants.is_empty() {
        return Err(invalid(format!("“{preferred}”至少需要一个同义词或缩写")));
    }
    if variants.len() + 1 > MAX_TERMS_PER_GROUP {
        return Err(invalid(format!("“{preferred}”的词条过多：每组最多 {MAX_TERMS_PER_GROUP} 个")));
    }
    let mut seen: Vec<String> = Vec::new();
    for t in std::iter::once(&preferred).chain(&variants) {
        let n = t.chars().count();
        if n > MAX_TERM_CHARS {
            return Err(invalid(format!("词条“{t}”过长：最多 {MAX_TERM_CHARS} 个字符")));
        }
        if n < 2 {
            return Err(invalid(format!("词条“{t}”过短：至少两个字符，单字会扩展几乎所有查询")));
        }
        if t.chars().any(|c| c == '|' || c == ',' || c == '，' || c.is_control()) {
            return Err(invalid(format!("词条“{t}”含有分隔符（| 或逗号）或控制字符")));
        }
        let k = fold(t);
        if seen.contains(&k) {
            return Err(invalid(format!("词条“{t}”在同一组中重复")));
        }
        seen.push(k);
    }
    let note = g.note.trim().chars().take(100).collect();
    Ok(NewSynonym { preferred, variants, note })
}

fn entry_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SynonymEntry> {
    let variants: String = r.get(2)?;
    Ok(SynonymEntry {
        id: r.get(0)?,
        preferred: r.get(1)?,
        variants: variants.split('|').filter(|v| !v.is_empty()).map(str::to_string).collect(),
        note: r.get(3)?,
        origin: r.get(4)?,
        updated_by: r.get(5)?,
        updated_at: r.get(6)?,
    })
}

const COLUMNS: &str = "id, preferred, variants, note, origin, updated_by, updated_at";

fn all_rows(conn: &Connection) -> Result<Vec<SynonymEntry>> {
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM synonyms ORDER BY preferred"))?;
    let rows = stmt.query_map([], entry_from_row)?;
    Ok(rows.collect::<std::result::Result<Vec<_>, _>>()?)
}

/// The stamp every process compares before a search.
pub fn version(conn: &Connection) -> Result<i64> {
    Ok(conn.prepare_cached("SELECT version FROM synonym_state WHERE id = 1")?.query_row([], |r| r.get(0))?)
}

fn bump(conn: &Connection) -> Result<()> {
    conn.execute("UPDATE synonym_state SET version = version + 1 WHERE id = 1", [])?;
    Ok(())
}

/// Refuses a group one of whose terms already belongs to another group (`except` is the group being replaced).
fn check_conflicts(conn: &Connection, g: &NewSynonym, except: Option<i64>) -> Result<()> {
    let mut owner: HashMap<String, String> = HashMap::new();
    for e in all_rows(conn)? {
        if Some(e.id) == except {
            continue;
        }
        for t in std::iter::once(&e.preferred).chain(&e.variants) {
            owner.insert(fold(t), e.preferred.clone());
        }
    }
    for t in std::iter::once(&g.preferred).chain(&g.variants) {
        if let Some(p) = owner.get(&fold(t)) {
            return Err(invalid(format!("词条“{t}”已属于“{p}”一组；一个词条只能属于一组，请先修改那一组")));
        }
    }
    Ok(())
}

fn insert(conn: &Connection, g: &NewSynonym, origin: &str, actor: &str) -> Result<i64> {
    conn.execute(
        "INSERT INTO synonyms (preferred, variants, note, origin, updated_by, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![g.preferred, g.variants.join("|"), g.note, origin, actor, now()],
    )?;
    Ok(conn.last_insert_rowid())
}

fn get(conn: &Connection, id: i64) -> Result<SynonymEntry> {
    conn.query_row(&format!("SELECT {COLUMNS} FROM synonyms WHERE id = ?1"), [id], entry_from_row)
        .optional()?
        .ok_or_else(|| Error::NotFound { what: format!("同义词组 {id}") })
}

/// Groups whose terms contain `filter` (compared folded), by preferred term; and how many match in all.
pub fn list(store: &Store, filter: Option<&str>, limit: usize, offset: usize) -> Result<(Vec<SynonymEntry>, usize)> {
    let conn = store.reader();
    let all = all_rows(&conn)?;
    let f = filter.map(fold).filter(|f| !f.is_empty());
    let hits: Vec<SynonymEntry> = all
        .into_iter()
        .filter(|e| match &f {
            None => true,
            Some(f) => std::iter::once(&e.preferred).chain(&e.variants).chain([&e.note]).any(|t| fold(t).contains(f)),
        })
        .collect();
    let total = hits.len();
    Ok((hits.into_iter().skip(offset).take(limit).collect(), total))
}

/// Adds a group, or replaces group `id`; audited as `synonym.add` / `synonym.update` in the same transaction.
pub fn save(store: &Store, actor: &str, id: Option<i64>, g: &NewSynonym) -> Result<SynonymEntry> {
    let g = clean(g)?;
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let count: i64 = tx.query_row("SELECT count(*) FROM synonyms", [], |r| r.get(0))?;
    if id.is_none() && count as usize >= MAX_GROUPS {
        return Err(invalid(format!("同义词表已有 {count} 组，达到上限 {MAX_GROUPS}")));
    }
    if let Some(id) = id {
        get(&tx, id)?;
    }
    check_conflicts(&tx, &g, id)?;
    // check_conflicts compared every term folded, the preferred one included: the UNIQUE constraint cannot fire.
    let new_id = match id {
        Some(id) => {
            tx.execute(
                "UPDATE synonyms SET preferred = ?2, variants = ?3, note = ?4, origin = 'admin', updated_by = ?5, \
                 updated_at = ?6 WHERE id = ?1",
                params![id, g.preferred, g.variants.join("|"), g.note, actor, now()],
            )?;
            id
        }
        None => insert(&tx, &g, "admin", actor)?,
    };
    let action = if id.is_some() { "synonym.update" } else { "synonym.add" };
    audit::append(
        &tx,
        actor,
        action,
        &serde_json::json!({"id": new_id, "preferred": g.preferred, "variants": g.variants}),
    )?;
    bump(&tx)?;
    let saved = get(&tx, new_id)?;
    tx.commit()?;
    Ok(saved)
}

/// Deletes group `id`; audited as `synonym.delete`.
pub fn delete(store: &Store, actor: &str, id: i64) -> Result<SynonymEntry> {
    let mut conn = store.conn();
    let tx = conn.transaction()?;
    let e = get(&tx, id)?;
    tx.execute("DELETE FROM synonyms WHERE id = ?1", [id])?;
    audit::append(&tx, actor, "synonym.delete", &serde_json::json!({"id": id, "preferred": e.preferred}))?;
    bump(&tx)?;
    tx.commit()?;
    Ok(e)
}

/// Parses a CSV of groups (`首选词,同义词,备注`, variants separated by `|`; a header row is optional). Every bad
/// line is named (up to 20) and nothing is imported when one is bad.
pub fn parse_csv(text: &str) -> Result<Vec<NewSynonym>> {
    if text.len() > MAX_CSV_BYTES {
        return Err(Error::TooLarge {
            what: "同义词 CSV".into(),
            size: text.len() as u64,
            limit: MAX_CSV_BYTES as u64,
            hint: "请拆分后分批导入".into(),
        });
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rdr = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
    let mut out: Vec<NewSynonym> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let mut keys: HashMap<String, usize> = HashMap::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 1;
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                errors.push(format!("第 {line} 行：不是有效的 CSV（{e}）"));
                break;
            }
        };
        // A cell the export neutralised (`'=…`) reads back as the text it was (csv_out::restore).
        let field = |i: usize| csv_out::restore(rec.get(i).unwrap_or(""));
        let first = field(0).trim();
        if line == 1 && matches!(first, "首选词" | "preferred") {
            continue;
        }
        if rec.iter().all(|f| f.trim().is_empty()) {
            continue;
        }
        let g = NewSynonym {
            preferred: first.to_string(),
            variants: vec![field(1).to_string()],
            note: field(2).to_string(),
        };
        match clean(&g) {
            Ok(g) => {
                for t in std::iter::once(&g.preferred).chain(&g.variants) {
                    if let Some(prev) = keys.insert(fold(t), line) {
                        errors.push(format!("第 {line} 行：词条“{t}”已出现在第 {prev} 行"));
                    }
                }
                out.push(g);
            }
            Err(e) => errors.push(format!("第 {line} 行：{e}")),
        }
        if errors.len() >= 20 || out.len() > MAX_GROUPS {
            break;
        }
    }
    if out.len() > MAX_GROUPS {
        errors.push(format!("超过 {MAX_GROUPS} 组的上限"));
    }
    if !errors.is_empty() {
        return Err(invalid(format!("同义词 CSV 有误，未导入任何内容：{}", errors.join("；"))));
    }
    Ok(out)
}

/// Imports groups: a group whose preferred term exists replaces it, others are added; with `replace`, groups not
/// in the file are removed. The resulting table is checked as a whole (a term in one group only) before anything
/// is written, audited as `synonym.import`, and all or nothing: it is written into `synonym_staging` a batch at a
/// time and moved into `synonyms` by one short transaction (the writer is never held for the whole file), which
/// refuses when the table changed meanwhile.
pub fn import(store: &Store, actor: &str, groups: &[NewSynonym], replace: bool, origin: &str) -> Result<ImportReport> {
    stage(store, actor, groups, replace, origin)?.commit(store)
}

/// An import checked and written to `synonym_staging`, not yet in force ([`Staged::commit`]).
pub struct Staged {
    snapshot: i64,
    rows: Vec<SynonymEntry>,
    report: ImportReport,
    actor: String,
    origin: String,
    replace: bool,
}

/// The first half of [`import`]: the table after the import computed and checked from a snapshot, and written to
/// `synonym_staging` a batch at a time.
pub fn stage(store: &Store, actor: &str, groups: &[NewSynonym], replace: bool, origin: &str) -> Result<Staged> {
    let groups: Vec<NewSynonym> = groups.iter().map(clean).collect::<Result<_>>()?;
    let (snapshot, existing) = {
        let conn = store.reader();
        // The version first: a change after it makes the move below refuse rather than overwrite it.
        (version(&conn)?, all_rows(&conn)?)
    };
    let mut report = ImportReport::default();
    // Each incoming group's terms folded once, preferred first.
    let folded: Vec<Vec<String>> =
        groups.iter().map(|g| std::iter::once(&g.preferred).chain(&g.variants).map(|t| fold(t)).collect()).collect();
    let incoming: HashMap<&str, usize> = folded.iter().enumerate().map(|(i, f)| (f[0].as_str(), i)).collect();
    // The table after the import: kept rows (by id) and incoming groups (by index), each term owned once.
    let mut owner: HashMap<String, String> = HashMap::new();
    let mut claim = |t: &str, key: String, preferred: &str| -> Result<()> {
        match owner.insert(key, preferred.to_string()) {
            Some(p) if p != preferred => {
                Err(invalid(format!("词条“{t}”同时属于“{p}”和“{preferred}”两组；一个词条只能属于一组")))
            }
            _ => Ok(()),
        }
    };
    let mut replaced: HashMap<usize, i64> = HashMap::new();
    let mut kept: Vec<SynonymEntry> = Vec::new();
    for e in existing.iter() {
        match incoming.get(fold(&e.preferred).as_str()) {
            Some(&i) => {
                replaced.insert(i, e.id);
            }
            None if replace => report.removed += 1,
            None => {
                for t in std::iter::once(&e.preferred).chain(&e.variants) {
                    claim(t, fold(t), &e.preferred)?;
                }
                kept.push(e.clone());
            }
        }
    }
    for (g, keys) in groups.iter().zip(&folded) {
        for (t, key) in std::iter::once(&g.preferred).chain(&g.variants).zip(keys) {
            claim(t, key.clone(), &g.preferred)?;
        }
    }
    if kept.len() + groups.len() > MAX_GROUPS {
        return Err(invalid(format!("导入后将有 {} 组，超过上限 {MAX_GROUPS}", kept.len() + groups.len())));
    }
    // Replaced groups keep their ids; new ones get ids above every existing one.
    let mut next_id = existing.iter().map(|e| e.id).max().unwrap_or(0) + 1;
    let at = now();
    let mut rows: Vec<SynonymEntry> = kept;
    for (i, g) in groups.iter().enumerate() {
        let id = match replaced.get(&i) {
            Some(&id) => {
                report.updated += 1;
                id
            }
            None => {
                report.added += 1;
                next_id += 1;
                next_id - 1
            }
        };
        rows.push(SynonymEntry {
            id,
            preferred: g.preferred.clone(),
            variants: g.variants.clone(),
            note: g.note.clone(),
            origin: origin.to_string(),
            updated_by: actor.to_string(),
            updated_at: at.clone(),
        });
    }
    empty(store, RETIRED)?;
    empty(store, "synonym_staging")?;
    let insert = format!("INSERT INTO synonym_staging ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
    store.in_batches(&rows, STAGING_BATCH, |tx, batch, _| {
        let mut stmt = tx.prepare_cached(&insert)?;
        for e in batch {
            stmt.execute(params![
                e.id,
                e.preferred,
                e.variants.join("|"),
                e.note,
                e.origin,
                e.updated_by,
                e.updated_at
            ])?;
        }
        Ok(())
    })?;
    Ok(Staged { snapshot, rows, report, actor: actor.to_string(), origin: origin.to_string(), replace })
}

impl Staged {
    /// The table as it will be once committed, labelled with the version the commit gives it.
    pub fn table(&self) -> SynonymTable {
        // In the order `SynonymTable::load` reads them.
        let mut rows: Vec<&SynonymEntry> = self.rows.iter().collect();
        rows.sort_by(|a, b| a.preferred.cmp(&b.preferred));
        let groups = rows.iter().map(|e| std::iter::once(e.preferred.clone()).chain(e.variants.clone()).collect());
        SynonymTable::build(self.snapshot + 1, groups.collect())
    }

    /// Moves the staged table into `synonyms` in one short transaction, audited; refused when the table changed
    /// since the snapshot.
    pub fn commit(self, store: &Store) -> Result<ImportReport> {
        let Staged { snapshot, report, actor, origin, replace, .. } = self;
        let mut conn = store.conn();
        let tx = conn.transaction()?;
        if version(&tx)? != snapshot {
            drop(tx);
            drop(conn);
            empty(store, "synonym_staging")?;
            return Err(invalid("导入期间同义词表被修改（他人刚刚编辑或导入过）；未导入任何内容，请重新导入".into()));
        }
        // The staged rows become the table by a rename (a copy of 50,000 rows held the writer ~100 ms); the old
        // table is emptied in short batches once this is committed.
        let staging = staging_like_synonyms(&tx)?;
        tx.execute_batch(&format!(
            "DROP TABLE IF EXISTS synonym_retired;
             ALTER TABLE synonyms RENAME TO synonym_retired;
             ALTER TABLE synonym_staging RENAME TO synonyms;
             {staging}"
        ))?;
        // The seed is part of a new data directory, like its schema: no one chose it, so no audit record says so.
        if origin != "seed" {
            let detail = serde_json::json!({"added": report.added, "updated": report.updated,
                "removed": report.removed, "replace": replace});
            audit::append(&tx, &actor, "synonym.import", &detail)?;
        }
        bump(&tx)?;
        tx.commit()?;
        drop(conn);
        empty(store, RETIRED)?;
        Ok(report)
    }
}

/// The statement that creates `synonym_staging` as `synonyms` is defined (its stored definition, with its name
/// quoted or not), so that the staged table, which becomes `synonyms`, keeps every constraint.
fn staging_like_synonyms(conn: &Connection) -> Result<String> {
    let sql: String =
        conn.query_row("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'synonyms'", [], |r| r.get(0))?;
    let columns = sql.find('(').map(|at| &sql[at..]);
    let columns = columns.ok_or_else(|| Error::Internal(format!("synonyms is defined without columns: {sql}")))?;
    Ok(format!("CREATE TABLE synonym_staging {columns}"))
}

/// Empties `table` (the one an import replaced, or what an interrupted import staged), [`STAGING_BATCH`] rows per
/// transaction: dropping or deleting 50,000 rows at once held the writer as long as copying them did. The replaced
/// table is dropped once empty; an import interrupted before that leaves it for the next one.
fn empty(store: &Store, table: &str) -> Result<()> {
    let exists: i64 =
        store.reader().query_row("SELECT count(*) FROM sqlite_schema WHERE name = ?1", [table], |r| r.get(0))?;
    if exists == 0 {
        return Ok(());
    }
    let rows: i64 = store.reader().query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
    let batches = vec![(); (rows as usize).div_ceil(STAGING_BATCH)];
    let delete = format!("DELETE FROM {table} WHERE id IN (SELECT id FROM {table} LIMIT {STAGING_BATCH})");
    store.in_batches(&batches, 1, |tx, _, _| Ok(tx.execute(&delete, []).map(drop)?))?;
    if table == RETIRED {
        store.conn().execute(&format!("DROP TABLE {RETIRED}"), [])?;
    }
    Ok(())
}

/// What the table an import replaced is called until [`empty`] drops it.
const RETIRED: &str = "synonym_retired";

/// Rows written to `synonym_staging` (or deleted from a replaced table) per transaction. The import runs at
/// background priority, so on a busy machine a batch holds the writer for longer than its own CPU time: 2,000 rows
/// held searches' audit records for up to 48 ms (release, 2 cores, 8 clients searching).
const STAGING_BATCH: usize = 500;

/// The whole table as CSV, in the format [`parse_csv`] reads (with a header). Written by [`CsvOut`], which
/// neutralises a term or note a spreadsheet would run as a formula; [`parse_csv`] reads such a cell back as it was.
pub fn export_csv(store: &Store) -> Result<String> {
    let conn = store.reader();
    let mut w = CsvOut::new();
    w.header(&["首选词", "同义词", "备注"]);
    for e in all_rows(&conn)? {
        w.row([Cell::Text(&e.preferred), Cell::Text(&e.variants.join("|")), Cell::Text(&e.note)]);
    }
    Ok(w.finish())
}

/// Loads the shipped seed table into a data directory that never had it (once: deletions stay deleted).
pub fn ensure_seeded(store: &Store) -> Result<()> {
    let seeded: i64 = store.reader().query_row("SELECT seeded FROM synonym_state WHERE id = 1", [], |r| r.get(0))?;
    if seeded != 0 {
        return Ok(());
    }
    let groups = parse_csv(SEED_CSV)?;
    let report = import(store, "system", &groups, false, "seed")?;
    store.conn().execute("UPDATE synonym_state SET seeded = 1 WHERE id = 1", [])?;
    tracing::info!(groups = report.added, "loaded the seed synonym table");
    Ok(())
}

/// The table as a search uses it: terms by folded key, longest matches first, and the pinyin of Chinese terms.
#[derive(Debug, Default)]
pub struct SynonymTable {
    pub version: i64,
    /// Each group's terms as written, preferred first.
    groups: Vec<Vec<String>>,
    /// Folded term → group.
    by_key: HashMap<String, usize>,
    /// The longest folded key, in bytes: how far a match can reach from where it starts.
    max_key_bytes: usize,
    /// Pinyin initials or full pinyin (lower-case ASCII) → Chinese words of the dictionary and the table, read
    /// with their characters' common readings.
    pinyin: HashMap<String, Vec<String>>,
    /// The same over the characters' other readings (混 as gun): used only when no common reading fits.
    pinyin_other: HashMap<String, Vec<String>>,
}

/// A table term found in a query.
#[derive(Debug, Clone, PartialEq)]
pub struct TermMatch {
    /// Byte range in the folded, lower-cased query.
    pub start: usize,
    pub end: usize,
    pub group: usize,
}

impl SynonymTable {
    /// The table's rows, labelled `version` (read by the caller before this).
    pub fn load(store: &Store, version: i64) -> Result<SynonymTable> {
        Self::load_from(&store.reader(), version)
    }

    /// [`SynonymTable::load`] through a connection of the caller's.
    pub fn load_from(conn: &Connection, version: i64) -> Result<SynonymTable> {
        let groups: Vec<Vec<String>> =
            all_rows(conn)?.into_iter().map(|e| std::iter::once(e.preferred).chain(e.variants).collect()).collect();
        Ok(SynonymTable::build(version, groups))
    }

    pub fn build(version: i64, groups: Vec<Vec<String>>) -> SynonymTable {
        // Folded once (OpenCC's conversion is most of an import's cost).
        let folded: Vec<Vec<String>> = groups.iter().map(|g| g.iter().map(|t| fold(t)).collect()).collect();
        let mut by_key = HashMap::new();
        for (i, g) in folded.iter().enumerate() {
            for k in g {
                by_key.entry(k.clone()).or_insert(i);
            }
        }
        by_key.remove("");
        let max_key_bytes = by_key.keys().map(String::len).max().unwrap_or(0);
        let words = crate::lexical::MEDICAL_DICT
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .chain(folded.into_iter().flatten());
        let mut pinyin: HashMap<String, Vec<String>> = HashMap::new();
        let mut pinyin_other: HashMap<String, Vec<String>> = HashMap::new();
        for w in words {
            let (common, other) = pinyin_keys(&w);
            for (map, keys) in [(&mut pinyin, common), (&mut pinyin_other, other)] {
                for key in keys {
                    let list = map.entry(key).or_default();
                    if !list.contains(&w) {
                        list.push(w.clone());
                    }
                }
            }
        }
        SynonymTable { version, groups, by_key, max_key_bytes, pinyin, pinyin_other }
    }

    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The group's terms, preferred first.
    pub fn terms(&self, group: usize) -> &[String] {
        &self.groups[group]
    }

    /// Whether `word` (folded) is a term of the table.
    pub fn contains(&self, word: &str) -> bool {
        self.by_key.contains_key(&fold(word))
    }

    /// Table terms in `lower` (a folded, lower-cased query), longest first and not overlapping. A Latin term
    /// matches only as a whole word (DM in "DM患者", not in "admin").
    pub fn find(&self, lower: &str) -> Vec<TermMatch> {
        // Every substring of the query up to the longest key is looked up, rather than every key searched for in
        // the query: a query is short and the table holds thousands of terms, and searching for each of them was a
        // tenth of a search's own work (not counting the encoder) under load.
        let mut found: Vec<(usize, usize)> = Vec::new();
        for (s, _) in lower.char_indices() {
            let reach = lower[s..].char_indices().skip(1).map(|(i, _)| s + i).chain([lower.len()]);
            for e in reach.take_while(|&e| e - s <= self.max_key_bytes) {
                if self.by_key.contains_key(&lower[s..e]) {
                    found.push((s, e));
                }
            }
        }
        // Longest first (2型糖尿病 over 糖尿病), then by term, then left to right; a match overlapping one taken is
        // dropped.
        found.sort_by(|a, b| {
            (b.1 - b.0).cmp(&(a.1 - a.0)).then_with(|| lower[a.0..a.1].cmp(&lower[b.0..b.1])).then(a.0.cmp(&b.0))
        });
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        let mut out: Vec<TermMatch> = Vec::new();
        for (s, e) in found {
            let latin = lower[s..e].chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
            let boundary = !latin || (!alnum(lower[..s].chars().next_back()) && !alnum(lower[e..].chars().next()));
            if boundary && !out.iter().any(|m| s < m.end && m.start < e) {
                out.push(TermMatch { start: s, end: e, group: self.by_key[&lower[s..e]] });
            }
        }
        out.sort_by_key(|m| m.start);
        out
    }

    /// Chinese words whose pinyin initials (gxy) or full pinyin (gaoxueya) are `ascii`: (read with the common
    /// readings, read with other readings of a character).
    pub fn pinyin_candidates(&self, ascii: &str) -> (Vec<String>, Vec<String>) {
        let k = ascii.to_ascii_lowercase();
        let get = |m: &HashMap<String, Vec<String>>| m.get(&k).cloned().unwrap_or_default();
        (get(&self.pinyin), get(&self.pinyin_other))
    }
}

/// The initials and the full pinyin of an all-Chinese word of 2–8 characters: first in each character's common
/// reading, then over its other readings (heteronyms: 血 is xue and xie; 混 is also gun), at most 16 combinations.
/// Returns (common, other) keys.
fn pinyin_keys(word: &str) -> (Vec<String>, Vec<String>) {
    let n = word.chars().count();
    if !(2..=8).contains(&n) {
        return (Vec::new(), Vec::new());
    }
    let mut combos: Vec<(String, String)> = vec![(String::new(), String::new())];
    for m in word.to_pinyin_multi() {
        let Some(m) = m else { return (Vec::new(), Vec::new()) };
        let mut next = Vec::new();
        for (ini, full) in &combos {
            for p in m.into_iter().take(3) {
                if next.len() < 16 {
                    next.push((format!("{ini}{}", p.first_letter()), format!("{full}{}", p.plain())));
                }
            }
        }
        combos = next;
    }
    // The first combination takes every character's first (common) reading.
    let mut common = Vec::new();
    let mut other = Vec::new();
    for (i, (ini, full)) in combos.into_iter().enumerate() {
        for k in [ini, full] {
            let list = if i == 0 { &mut common } else { &mut other };
            if !list.contains(&k) {
                list.push(k);
            }
        }
    }
    other.retain(|k| !common.contains(k));
    (common, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(groups: &[&[&str]]) -> SynonymTable {
        SynonymTable::build(1, groups.iter().map(|g| g.iter().map(|t| t.to_string()).collect()).collect())
    }

    #[test]
    fn an_import_swaps_the_staged_table_in_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("care.sqlite")).unwrap();
        let group =
            |p: &str, v: &str| NewSynonym { preferred: p.into(), variants: vec![v.into()], note: String::new() };
        let groups: Vec<NewSynonym> = (0..5_000).map(|i| group(&format!("术语{i}"), &format!("别名{i}"))).collect();
        let before = version(&store.reader()).unwrap();
        assert_eq!(import(&store, "admin", &groups, true, "import").unwrap().added, 5_000);
        assert_eq!(import(&store, "admin", &[group("高血压", "HBP")], true, "import").unwrap().removed, 5_000);
        let conn = store.reader();
        assert_eq!(all_rows(&conn).unwrap().iter().map(|e| e.preferred.as_str()).collect::<Vec<_>>(), ["高血压"]);
        assert!(version(&conn).unwrap() > before);
        let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
        assert_eq!(
            count("SELECT count(*) FROM sqlite_schema WHERE name = 'synonym_retired'"),
            0,
            "the old table is dropped"
        );
        assert_eq!(count("SELECT count(*) FROM synonym_staging"), 0);
        drop(conn);
        // The swapped-in table keeps the constraints of `synonyms`.
        let bad = store.conn().execute(
            "INSERT INTO synonyms (preferred, variants, origin, updated_by, updated_at) VALUES ('x', '', 'bogus', 'a', 'b')",
            [],
        );
        assert!(bad.is_err(), "origin is checked after the swap too");
    }

    #[test]
    fn longest_terms_win_and_latin_terms_match_whole_words() {
        let t = table(&[&["糖尿病", "DM"], &["2型糖尿病", "T2DM"], &["慢性阻塞性肺疾病", "慢阻肺", "COPD"]]);
        let m = t.find(&fold("2型糖尿病合并慢阻肺"));
        assert_eq!(
            m.iter().map(|m| t.terms(m.group)[0].as_str()).collect::<Vec<_>>(),
            ["2型糖尿病", "慢性阻塞性肺疾病"]
        );
        assert_eq!(t.find(&fold("DM患者")).len(), 1);
        assert!(t.find("admin").is_empty(), "DM inside a Latin word is no match");
        assert_eq!(t.find(&fold("ＣＯＰＤ急性加重")).len(), 1, "full-width and upper case fold");
        assert!(t.contains("copd") && !t.contains("肺"));
    }

    #[test]
    fn pinyin_initials_and_full_pinyin_find_dictionary_words() {
        let t = table(&[&["慢性阻塞性肺疾病", "慢阻肺"]]);
        assert!(t.pinyin_candidates("gxy").0.contains(&"高血压".to_string()), "{:?}", t.pinyin_candidates("gxy"));
        assert!(t.pinyin_candidates("GaoXueYa").0.contains(&"高血压".to_string()));
        assert_eq!(t.pinyin_candidates("mzf").0, vec!["慢阻肺".to_string()]);
        assert_eq!(t.pinyin_candidates("qwzxv"), (Vec::new(), Vec::new()));
        // 混悬液 is hxy; read with 混's rare reading gun it is only a fallback for gxy.
        assert!(!t.pinyin_candidates("gxy").0.contains(&"混悬液".to_string()));
        assert!(t.pinyin_candidates("hxy").0.contains(&"混悬液".to_string()));
    }

    #[test]
    fn csv_import_reads_neutralised_cells_back_as_typed() {
        // What export_csv writes for terms and notes starting with a formula character (csv_out::neutralise).
        let g = parse_csv("首选词,同义词,备注\r\n'=甲乙,'-丙丁|戊己,'@备注\r\n''=庚辛,壬癸,it's\r\n").unwrap();
        assert_eq!(
            (g[0].preferred.as_str(), g[0].variants.as_slice(), g[0].note.as_str()),
            ("=甲乙", &["-丙丁".to_string(), "戊己".to_string()][..], "@备注")
        );
        // Only the apostrophe the export added comes off: a text's own stays.
        assert_eq!((g[1].preferred.as_str(), g[1].note.as_str()), ("'=庚辛", "it's"));
    }

    #[test]
    fn csv_is_checked_line_by_line_and_nothing_is_half_read() {
        let ok =
            parse_csv("首选词,同义词,备注\n心肌梗死,心梗|MI,心血管\n\n冠心病,冠状动脉粥样硬化性心脏病|CHD,\n").unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].variants, vec!["心梗", "MI"]);
        let err = parse_csv("心肌梗死,心梗\n心梗死,心梗\n肺,肺脏\n高血压,\n").unwrap_err().to_string();
        assert!(err.contains("第 2 行") && err.contains("第 3 行") && err.contains("第 4 行"), "{err}");
        let too_big = "a".repeat(MAX_CSV_BYTES + 1);
        assert!(matches!(parse_csv(&too_big), Err(Error::TooLarge { .. })));
    }

    #[test]
    fn the_seed_table_is_valid_and_large_enough() {
        let groups = parse_csv(SEED_CSV).expect("the seed table parses");
        assert!(groups.len() >= 300, "{} groups", groups.len());
        let t = SynonymTable::build(
            1,
            groups.into_iter().map(|g| std::iter::once(g.preferred).chain(g.variants).collect()).collect(),
        );
        for q in ["COPD", "慢阻肺", "心梗", "DM"] {
            assert!(!t.find(&fold(q)).is_empty(), "{q} is in the seed table");
        }
    }

    /// What `find` did before it looked substrings up: every key searched for in the query, longest first.
    fn find_by_searching_keys(t: &SynonymTable, lower: &str) -> Vec<TermMatch> {
        let mut keys: Vec<&String> = t.by_key.keys().collect();
        keys.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        let mut out: Vec<TermMatch> = Vec::new();
        for k in keys {
            let mut from = 0;
            while let Some(p) = lower[from..].find(k.as_str()) {
                let (s, e) = (from + p, from + p + k.len());
                from = s + lower[s..].chars().next().map_or(1, char::len_utf8);
                let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
                let latin = k.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
                let boundary = !latin || (!alnum(lower[..s].chars().next_back()) && !alnum(lower[e..].chars().next()));
                if boundary && !out.iter().any(|m| s < m.end && m.start < e) {
                    out.push(TermMatch { start: s, end: e, group: t.by_key[k] });
                }
            }
        }
        out.sort_by_key(|m| m.start);
        out
    }

    #[test]
    fn looking_substrings_up_finds_what_searching_every_key_found() {
        let groups = parse_csv(SEED_CSV).unwrap();
        let t = SynonymTable::build(
            1,
            groups.into_iter().map(|g| std::iter::once(g.preferred).chain(g.variants).collect()).collect(),
        );
        let mut keys: Vec<&String> = t.by_key.keys().collect();
        keys.sort();
        let filler = ["的", "患者", "a", "1", " ", "型", "急性", "x"];
        let mut seed = 0x5EED_u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        for _ in 0..3000 {
            let mut q = String::new();
            for _ in 0..1 + next() % 6 {
                match next() % 3 {
                    0 => q.push_str(filler[next() % filler.len()]),
                    // A key cut short: a prefix of a term, or a term running into the next one.
                    1 => q.push_str(&keys[next() % keys.len()].chars().take(1 + next() % 3).collect::<String>()),
                    _ => q.push_str(keys[next() % keys.len()]),
                }
            }
            assert_eq!(t.find(&q), find_by_searching_keys(&t, &q), "{q}");
        }
    }
}
