// CARE: progressive enhancement only (every page works without it). No inline scripts anywhere: CSP forbids them.
"use strict";

function csrfToken() {
  const m = document.querySelector('meta[name="csrf-token"]');
  return m ? m.content : "";
}

// Uploads: send with XMLHttpRequest to show upload progress, then follow the server's redirect to the jobs page.
function enhanceUploads() {
  document.querySelectorAll("form[data-upload]").forEach(function (form) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      const bar = form.querySelector("progress");
      const status = form.querySelector(".upload-status");
      const xhr = new XMLHttpRequest();
      xhr.open("POST", form.action);
      xhr.setRequestHeader("X-CSRF-Token", csrfToken());
      xhr.upload.addEventListener("progress", function (e) {
        if (e.lengthComputable) {
          bar.hidden = false;
          bar.value = Math.round((e.loaded / e.total) * 100);
          status.textContent = "上传中 " + bar.value + "%";
        }
      });
      xhr.addEventListener("load", function () {
        if (xhr.responseURL) {
          window.location.assign(xhr.responseURL);
        } else {
          status.textContent = "上传完成";
        }
      });
      xhr.addEventListener("error", function () {
        status.textContent = "上传失败，请重试";
      });
      xhr.send(new FormData(form));
    });
  });
}

// Job states as people read them (the API keeps the codes).
const STATE_ZH = { queued: "排队中", running: "进行中", done: "完成", failed: "失败", cancelled: "已取消" };

// Jobs page: poll the JSON API and update progress, state and per-file errors in place.
function pollJobs() {
  const table = document.querySelector("table[data-poll]");
  if (!table) return;
  const url = table.getAttribute("data-poll");
  function tick() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (jobs) {
        let active = false;
        // The models page lists only model jobs (data-kinds="model."); it reloads when one ends, to show its report.
        const kinds = table.getAttribute("data-kinds") || "";
        jobs.filter(function (j) { return j.kind.indexOf(kinds) === 0; }).forEach(function (j) {
          const row = table.querySelector('tr[data-job="' + j.id + '"]');
          const live = function (s) { return s === "queued" || s === "running"; };
          if (!row) {
            if (live(j.state)) window.location.reload();
            return;
          }
          if (kinds && live(row.getAttribute("data-state")) && !live(j.state)) window.location.reload();
          row.setAttribute("data-state", j.state);
          const st = row.querySelector(".state");
          st.textContent = STATE_ZH[j.state] || j.state;
          st.className = "state state-" + j.state;
          const bar = row.querySelector("progress");
          bar.max = j.progress_total;
          bar.value = j.progress_done;
          row.querySelector(".count").textContent = j.kind === "ingest"
            ? j.progress_done + "/" + j.progress_total + " 个文件 · " + j.documents + " 篇文档" + (j.stage ? " · " + j.stage : "")
            : j.stage + " " + j.progress_done + "/" + j.progress_total + (j.kind === "backup.create" ? " MB" : "");
          const errs = row.querySelector(".errors");
          if (j.errors.length === 0) {
            errs.textContent = "—";
          } else {
            const ul = document.createElement("ul");
            j.errors.forEach(function (e) {
              const li = document.createElement("li");
              if (e.file) {
                const b = document.createElement("strong");
                b.textContent = e.file;
                li.appendChild(b);
              }
              li.appendChild(document.createTextNode("（" + e.code + "）：" + e.message));
              ul.appendChild(li);
            });
            errs.replaceChildren(ul);
          }
          if (j.state === "queued" || j.state === "running") active = true;
          else {
            const f = row.querySelector("form");
            if (f) f.remove();
          }
        });
        setTimeout(tick, active ? 1000 : 2000);
      })
      .catch(function () { setTimeout(tick, 5000); });
  }
  tick();
}

// Forms that delete something ask first (data-confirm holds the question).
function confirmForms() {
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (ev) {
      if (!window.confirm(form.getAttribute("data-confirm"))) { ev.preventDefault(); }
    });
  });
}

// While the trainer is still being built (the demo builds it after serving), ask every 10 s whether it is ready and
// reload the training page once it is, so 开始训练 enables itself.
function waitForTrainer() {
  if (!document.getElementById("trainer-building")) return;
  function tick() {
    fetch("/api/v1/admin/training", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (j) {
        if (j && j.trainer && !j.trainer.building) window.location.reload();
        else setTimeout(tick, 10000);
      })
      .catch(function () { setTimeout(tick, 10000); });
  }
  setTimeout(tick, 10000);
}

// The main navigation marks the page it leads to (or the section it is in) for screen readers and the eye.
function markCurrentPage() {
  const here = location.pathname;
  document.querySelectorAll('nav[aria-label="主导航"] a').forEach(function (a) {
    if (here === a.pathname || here.startsWith(a.pathname + "/")) {
      a.setAttribute("aria-current", "page");
    }
  });
}

// On a narrow screen the facets start folded (they stay open without script, and on wide screens).
function foldFacets() {
  if (window.matchMedia("(max-width: 600px)").matches) {
    document.querySelectorAll("details.facets-fold").forEach(function (d) {
      d.removeAttribute("open");
    });
  }
}

// Feedback (有帮助/没帮助) is sent without leaving the page: following the server's redirect would run the search
// again and count it twice in the analytics. Should sending fail, the form is submitted as without script.
function enhanceFeedback() {
  document.querySelectorAll("form.feedback").forEach(function (form) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      const body = new URLSearchParams(new FormData(form));
      if (ev.submitter && ev.submitter.name) {
        body.set(ev.submitter.name, ev.submitter.value);
      }
      fetch(form.action, {
        method: "POST",
        body: body,
        credentials: "same-origin",
        redirect: "manual",
        headers: { "X-CSRF-Token": csrfToken() },
      })
        .then(function (r) {
          if (r.type !== "opaqueredirect" && !r.ok) {
            throw new Error("feedback " + r.status);
          }
          let note = form.querySelector(".judged");
          if (!note) {
            note = document.createElement("span");
            note.className = "meta judged";
            form.appendChild(note);
          }
          note.setAttribute("role", "status");
          note.textContent = "已记录，谢谢";
        })
        .catch(function () {
          form.submit();
        });
    });
  });
}

// Signing in says so on the page it leads to: the sign-in form leaves a mark for this tab. The sign-in page keeps it
// (a refused password is tried again); the next other page clears it, and says who is signed in when it shows the
// navigation (the caller is signed in).
function sayWhenSignedIn() {
  const form = document.querySelector('form[action="/login"]');
  if (form) {
    form.addEventListener("submit", function () {
      try { sessionStorage.setItem("care.signing-in", "1"); } catch (e) { /* storage off: nothing said */ }
    });
  }
  let pending = null;
  try {
    pending = sessionStorage.getItem("care.signing-in");
  } catch (e) {
    return;
  }
  if (!pending || form) {
    return;
  }
  sessionStorage.removeItem("care.signing-in");
  const account = document.querySelector('nav[aria-label="主导航"] a[href="/account"]');
  const main = document.getElementById("main");
  if (account && main) {
    const note = document.createElement("p");
    note.className = "flash";
    note.id = "signed-in";
    note.setAttribute("role", "status");
    note.textContent = "已登录：" + account.textContent.trim();
    main.insertBefore(note, main.firstChild);
  }
}

document.addEventListener("DOMContentLoaded", function () {
  sayWhenSignedIn();
  markCurrentPage();
  enhanceFeedback();
  foldFacets();
  enhanceUploads();
  pollJobs();
  confirmForms();
  waitForTrainer();
});
