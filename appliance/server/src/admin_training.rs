//! The console's 训练 page: whether the trainer can run here, retraining schedules, runs with their progress, data
//! counts, phase times, loss charts and the gate's decision, and "train now". Forms call the same engine operations
//! as `/api/v1/admin/training/*` and `care train`.

use crate::filters;
use actix_web::{HttpResponse, get, post, web};
use askama::Template;
use care_engine::training::schedule::{Schedule, ScheduleSpec};
use care_engine::training::{Estimate, Recipe, Sides, TrainerStatus, TrainingDisk, TrainingRun};
use serde::Deserialize;

use crate::AppState;
use crate::admin::{Flash, back_with, back_with_error};
use crate::call::call_admin;
use crate::errors::ApiError;
use crate::guard::Caller;
use crate::pages::{Nav, render};

const WEEKDAYS: [&str; 7] = ["周一", "周二", "周三", "周四", "周五", "周六", "周日"];

pub struct RunRow {
    pub run: TrainingRun,
    pub percent: i64,
    pub counts: String,
    pub phases: String,
    /// Engine-generated SVG (numbers and escaped labels only); shown inline for finished runs.
    pub loss_svg: String,
}

pub struct ScheduleRow {
    pub s: Schedule,
    pub when: String,
}

#[derive(Template)]
#[template(path = "admin_training.html")]
struct TrainingPage {
    nav: Option<Nav>,
    flash: Option<String>,
    error: Option<String>,
    csrf: String,
    trainer: TrainerStatus,
    live: String,
    approved: Vec<String>,
    /// The recipe this machine runs by default ([`Recipe::for_device`]): both sides on a GPU.
    defaults: Recipe,
    /// The default recipe's expected wall time, from the newest finished run of its shape here.
    estimate: Option<Estimate>,
    /// Free space on the data disk against a run's needs; None when no pair is live.
    disk: Option<TrainingDisk>,
    /// The same for a run that trains the document side too (its weights and the new document vectors).
    disk_both: Option<TrainingDisk>,
    /// The default recipe with `sides = both`, judged from past runs of that shape (re-embedding included).
    estimate_both: Option<Estimate>,
    schedules: Vec<ScheduleRow>,
    runs: Vec<RunRow>,
}

impl TrainingPage {
    fn disk_short(&self) -> bool {
        self.disk.as_ref().is_some_and(|d| !d.enough())
    }

    fn both_by_default(&self) -> bool {
        self.defaults.sides == Sides::Both
    }
}

fn describe(s: &Schedule) -> String {
    let mut parts = Vec::new();
    if let Some(t) = &s.spec.time {
        let day = s.spec.weekday.and_then(|w| WEEKDAYS.get(usize::from(w))).copied().unwrap_or("每天");
        parts.push(format!("{day} {t}"));
    }
    if let Some(n) = s.spec.min_new_feedback {
        parts.push(format!("新反馈 ≥ {n} 条（目前 {} 条）", s.new_feedback));
    }
    parts.join(" 或 ")
}

fn row(e: &care_engine::Engine, a: &care_engine::Admin, run: TrainingRun) -> RunRow {
    let percent = if run.progress_total > 0 { run.progress_done * 100 / run.progress_total } else { 0 };
    let counts = run.counts.as_ref().map_or_else(String::new, |c| {
        let cols: Vec<String> = c
            .collections
            .iter()
            .map(|k| {
                format!(
                    "{}：{} 段落、{} 条训练查询（评测部分 {} 条未用）",
                    k.name, k.passages, k.train_queries, k.eval_queries_left_out
                )
            })
            .collect();
        format!(
            "{}；Stage I {} 段落 + {} 条查询（标注训练部分与检索记录）；Stage II {} 组（标注 {}、标题路径 {}），\
             负例：标注 {}、挖掘候选 {}、\
             疑似假负例剔除 {}（阈值 正例分 − {:.3}）、关键词匹配补足 {} 个（剔除 {}）、随机补足 {} 组 {} 个{}",
            cols.join("；"),
            c.stage1_passages,
            c.stage1_queries,
            c.stage2_groups,
            c.judged_pairs,
            c.heading_pairs,
            c.judged_negatives,
            c.mined_candidates,
            c.false_negatives_dropped,
            c.false_negative_margin,
            c.lexical_negatives,
            c.lexical_dropped,
            c.groups_topped_up,
            c.random_negatives,
            if c.mined_from.is_empty() {
                String::new()
            } else {
                format!("；挖掘用 {} 检索 {} 的在用向量", c.mined_with, c.mined_from)
            }
        )
    });
    let phases =
        run.phases.iter().map(|(p, s)| format!("{} {s:.0} 秒", phase_label(p))).collect::<Vec<_>>().join(" · ");
    let loss_svg = if run.phases.iter().any(|p| p.0 == "stage2") {
        e.training().loss_svg(a, run.job).unwrap_or_default()
    } else {
        String::new()
    };
    RunRow { run, percent, counts, phases, loss_svg }
}

/// A run's phase as the page names it.
fn phase_label(phase: &str) -> &str {
    match phase {
        "data" => "整理数据",
        "init" => "裁剪查询编码器",
        "stage1" => "Stage I",
        "stage2" => "Stage II",
        "merge" => "合并权重",
        "export" => "导出",
        "import" => "导入",
        "embed" => "重新生成文档向量",
        "evaluate" => "评测",
        "promote" => "上线",
        other => other,
    }
}

#[get("/admin/training")]
pub async fn training_page(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Query<Flash>,
) -> Result<HttpResponse, ApiError> {
    let (trainer, live, approved, schedules, runs, (estimate, disk, disk_both, estimate_both, defaults)) =
        call_admin(&state, &caller, |e, a| {
            let runs: Vec<RunRow> = e.training().runs(a, 20)?.into_iter().map(|r| row(e, a, r)).collect();
            let live = e
                .retrieval()
                .active_models()?
                .map(|p| format!("{}@{} / {}@{}", p.query.name, p.query.version, p.document.name, p.document.version));
            let approved = e
                .collections()
                .list(a)?
                .into_iter()
                .filter(|c| c.collection.approved_for_training)
                .map(|c| c.collection.name)
                .collect();
            let schedules =
                e.training().schedules(a)?.into_iter().map(|s| ScheduleRow { when: describe(&s), s }).collect();
            let defaults = e.training().default_recipe();
            let estimate = (
                e.training().estimate(a, &defaults)?,
                e.training().disk(a, defaults.sides)?,
                e.training().disk(a, Sides::Both)?,
                e.training().estimate(a, &Recipe { sides: Sides::Both, ..defaults.clone() })?,
                defaults,
            );
            Ok((
                care_engine::training::trainer_status(&e),
                live.unwrap_or_default(),
                approved,
                schedules,
                runs,
                estimate,
            ))
        })
        .await?;
    let f = f.into_inner();
    render(&TrainingPage {
        nav: Nav::of(&caller),
        flash: f.flash(),
        error: f.error(),
        csrf: caller.csrf().to_string(),
        trainer,
        live,
        approved,
        defaults,
        estimate,
        disk,
        disk_both,
        estimate_both,
        schedules,
        runs,
    })
}

/// The recipe fields the form offers; the rest keep their defaults.
#[derive(Debug, Deserialize)]
pub struct RecipeForm {
    #[serde(default)]
    query_layers: String,
    #[serde(default)]
    stage1_steps: String,
    #[serde(default)]
    stage2_steps: String,
    #[serde(default)]
    merge_ratio: String,
    #[serde(default)]
    sides: String,
    #[serde(default)]
    stage2_batch_size: String,
    #[serde(default)]
    promote: Option<String>,
    #[serde(default)]
    search_queries: Option<String>,
    #[serde(default)]
    weekday: String,
    #[serde(default)]
    time: String,
    #[serde(default)]
    min_new_feedback: String,
}

fn number<T: std::str::FromStr>(field: &str, v: &str) -> Result<Option<T>, care_engine::Error> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|_| care_engine::Error::InvalidInput(format!("{field} 应为正整数 ({field}: {v:?} is not a number)")))
}

impl RecipeForm {
    /// The form's settings over `base`, the recipe this machine runs by default (the schedule form has no sides
    /// field: a schedule takes the default's).
    fn recipe(&self, base: Recipe) -> Result<Recipe, care_engine::Error> {
        let mut r = base;
        r.query_layers = number("query_layers", &self.query_layers)?;
        r.stage1_steps = number("stage1_steps", &self.stage1_steps)?.unwrap_or(r.stage1_steps);
        r.stage2_steps = number("stage2_steps", &self.stage2_steps)?.unwrap_or(r.stage2_steps);
        r.stage2_batch_size = number("stage2_batch_size", &self.stage2_batch_size)?.unwrap_or(r.stage2_batch_size);
        r.sides = match self.sides.trim() {
            "" => r.sides,
            "query_only" => Sides::QueryOnly,
            "both" => Sides::Both,
            other => {
                return Err(care_engine::Error::InvalidInput(format!(
                    "训练范围只能是 query_only 或 both (sides: {other:?})"
                )));
            }
        };
        let ratio = self.merge_ratio.trim();
        if !ratio.is_empty() {
            r.merge_ratio = ratio.parse().map_err(|_| {
                care_engine::Error::InvalidInput(format!(
                    "与起点平均的比例应为 0 到 1 之间的小数 (merge_ratio: {ratio:?} is not a number)"
                ))
            })?;
        }
        r.promote = self.promote.is_some();
        r.data.include_search_queries = self.search_queries.is_some();
        Ok(r)
    }
}

#[post("/admin/training/run")]
pub async fn train_now(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<RecipeForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    match call_admin(&state, &caller, move |e, a| {
        e.training().submit(a, &f.recipe(e.training().default_recipe())?, None)
    })
    .await
    {
        Ok(id) => Ok(back_with("/admin/training", &format!("已提交训练任务 #{id}，进度见本页"))),
        Err(e) => back_with_error("/admin/training", e),
    }
}

#[post("/admin/training/schedules")]
pub async fn add_schedule(
    state: web::Data<AppState>,
    caller: Caller,
    f: web::Form<RecipeForm>,
) -> Result<HttpResponse, ApiError> {
    let f = f.into_inner();
    let r = call_admin(&state, &caller, move |e, a| {
        let spec = ScheduleSpec {
            weekday: number("weekday", &f.weekday)?,
            time: Some(f.time.trim().to_string()).filter(|t| !t.is_empty()),
            min_new_feedback: number("min_new_feedback", &f.min_new_feedback)?,
            recipe: f.recipe(e.training().default_recipe())?,
            enabled: true,
        };
        e.training().set_schedule(a, None, &spec)
    })
    .await;
    match r {
        Ok(id) => Ok(back_with("/admin/training", &format!("已添加训练计划 #{id}"))),
        Err(e) => back_with_error("/admin/training", e),
    }
}

#[post("/admin/training/schedules/{id}/delete")]
pub async fn delete_schedule(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    match call_admin(&state, &caller, move |e, a| e.training().delete_schedule(a, id)).await {
        Ok(()) => Ok(back_with("/admin/training", &format!("已删除训练计划 #{id}"))),
        Err(e) => back_with_error("/admin/training", e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A form as the browser posts it (`a=1&b=2`; values here need no escaping).
    fn form(pairs: &str) -> RecipeForm {
        let fields: serde_json::Map<String, serde_json::Value> = pairs
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        serde_json::from_value(serde_json::Value::Object(fields)).unwrap()
    }

    #[test]
    fn the_form_chooses_the_sides_and_the_stage_two_batch() {
        let r = form("sides=both&stage2_steps=150&stage2_batch_size=8&promote=1").recipe(Recipe::default()).unwrap();
        assert_eq!((r.sides, r.stage2_steps, r.stage2_batch_size, r.promote), (Sides::Both, 150, 8, true));
        let r = form("stage2_batch_size=").recipe(Recipe::default()).unwrap();
        assert_eq!((r.sides, r.stage2_batch_size), (Sides::QueryOnly, Recipe::default().stage2_batch_size));
        let err = form("sides=documents").recipe(Recipe::default()).unwrap_err();
        assert!(err.to_string().contains("训练范围"), "{err}");
        assert!(form("stage2_batch_size=x").recipe(Recipe::default()).is_err());
        // On a GPU both sides train by default; a form without a sides field (the schedule's) keeps that.
        let gpu = Recipe::for_device("cuda");
        assert_eq!(form("stage2_steps=10").recipe(gpu.clone()).unwrap().sides, Sides::Both);
        assert_eq!(form("sides=query_only").recipe(gpu).unwrap().sides, Sides::QueryOnly);
        assert_eq!(phase_label("embed"), "重新生成文档向量");
    }
}
