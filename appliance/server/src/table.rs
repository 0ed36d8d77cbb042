//! The access table: every route the server answers, with who may use it.
//!
//! The guard middleware looks each request's matched route up here and fails closed: a route that is registered
//! but missing from this table answers 500 instead of running, so a new handler cannot ship without an access
//! decision. The authorisation matrix test (tests/tests/web.rs) enumerates this table and fails for a route that
//! has no expected outcome there.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, including anonymous clients (login, health, assets, API description).
    Public,
    /// Any signed-in user (session or API token).
    User,
    /// Administrators only.
    Admin,
    /// Administrators, and tokens that open only backups (a standby's); no other route admits those tokens.
    Backups,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// HTML for browsers: anonymous users are redirected to /login.
    Page,
    /// JSON (or CSV/text) for programs: anonymous users get 401.
    Api,
}

#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    /// The actix path pattern exactly as registered.
    pub pattern: &'static str,
    pub access: Access,
    pub kind: Kind,
}

const fn r(method: &'static str, pattern: &'static str, access: Access, kind: Kind) -> Route {
    Route { method, pattern, access, kind }
}

use Access::{Admin, Backups, Public, User};
use Kind::{Api, Page};

pub const ROUTES: &[Route] = &[
    // Public
    r("GET", "/", Public, Page),
    r("GET", "/healthz", Public, Api),
    r("GET", "/assets/{file}", Public, Api),
    r("GET", "/login", Public, Page),
    r("POST", "/login", Public, Page),
    r("GET", "/login/oidc", Public, Page),
    r("GET", "/login/oidc/callback", Public, Page),
    r("GET", "/embed", Public, Page),
    r("GET", "/api/v1/openapi.json", Public, Api),
    // Signed-in users (clinicians and admins)
    r("GET", "/search", User, Page),
    r("GET", "/doc/{id}", User, Page),
    r("POST", "/feedback", User, Page),
    r("POST", "/logout", User, Page),
    r("GET", "/account", User, Page),
    r("POST", "/account/password", User, Page),
    r("GET", "/api/v1/me", User, Api),
    r("POST", "/api/v1/me/password", User, Api),
    r("GET", "/api/v1/search", User, Api),
    r("GET", "/api/v1/collections", User, Api),
    r("GET", "/api/v1/documents/{id}", User, Api),
    r("POST", "/api/v1/feedback", User, Api),
    // Administrators: console pages
    r("GET", "/admin", Admin, Page),
    r("GET", "/admin/overview", Admin, Page),
    r("GET", "/admin/collections", Admin, Page),
    r("POST", "/admin/collections", Admin, Page),
    r("POST", "/admin/collections/{name}/upload", Admin, Page),
    r("POST", "/admin/collections/{name}/approve", Admin, Page),
    r("POST", "/admin/collections/{name}/delete", Admin, Page),
    r("GET", "/admin/collections/{name}/documents", Admin, Page),
    r("POST", "/admin/collections/{name}/documents/file", Admin, Page),
    r("POST", "/admin/collections/{name}/documents/delete", Admin, Page),
    r("POST", "/admin/collections/{name}/documents/replace", Admin, Page),
    r("GET", "/admin/jobs", Admin, Page),
    r("POST", "/admin/jobs/{id}/cancel", Admin, Page),
    r("GET", "/admin/users", Admin, Page),
    r("POST", "/admin/users", Admin, Page),
    r("POST", "/admin/users/{name}", Admin, Page),
    r("POST", "/admin/users/{name}/grants", Admin, Page),
    r("POST", "/admin/users/{name}/tokens", Admin, Page),
    r("POST", "/admin/tokens/{id}/revoke", Admin, Page),
    r("GET", "/admin/models", Admin, Page),
    r("POST", "/admin/models/activate", Admin, Page),
    r("POST", "/admin/models/evaluate", Admin, Page),
    r("POST", "/admin/models/promote", Admin, Page),
    r("POST", "/admin/models/reject", Admin, Page),
    r("POST", "/admin/models/rollback", Admin, Page),
    r("POST", "/admin/models/import", Admin, Page),
    r("GET", "/admin/training", Admin, Page),
    r("POST", "/admin/training/run", Admin, Page),
    r("POST", "/admin/training/schedules", Admin, Page),
    r("POST", "/admin/training/schedules/{id}/delete", Admin, Page),
    r("POST", "/admin/judgments", Admin, Page),
    r("GET", "/admin/synonyms", Admin, Page),
    r("POST", "/admin/synonyms", Admin, Page),
    r("POST", "/admin/synonyms/import", Admin, Page),
    r("POST", "/admin/synonyms/{id}", Admin, Page),
    r("POST", "/admin/synonyms/{id}/delete", Admin, Page),
    r("GET", "/admin/synonyms.csv", Admin, Api),
    r("GET", "/admin/settings", Admin, Page),
    r("POST", "/admin/settings", Admin, Page),
    r("POST", "/admin/settings/sign-in", Admin, Page),
    r("POST", "/admin/settings/backup", Admin, Page),
    r("POST", "/admin/backups", Admin, Page),
    r("GET", "/admin/audit", Admin, Page),
    r("GET", "/admin/audit.csv", Admin, Api),
    r("GET", "/admin/analytics", Admin, Page),
    r("GET", "/admin/analytics.csv", Admin, Api),
    r("GET", "/api/v1/admin/analytics", Admin, Api),
    r("GET", "/metrics", Admin, Api),
    // Administrators: JSON API
    r("GET", "/api/v1/admin/collections", Admin, Api),
    r("POST", "/api/v1/admin/collections", Admin, Api),
    r("DELETE", "/api/v1/admin/collections/{name}", Admin, Api),
    r("POST", "/api/v1/admin/collections/{name}/files", Admin, Api),
    r("PUT", "/api/v1/admin/collections/{name}/approval", Admin, Api),
    r("GET", "/api/v1/admin/backups", Backups, Api),
    r("GET", "/api/v1/admin/backups/{name}", Backups, Api),
    r("GET", "/api/v1/admin/jobs", Admin, Api),
    r("GET", "/api/v1/admin/jobs/{id}", Admin, Api),
    r("POST", "/api/v1/admin/jobs/{id}/cancel", Admin, Api),
    r("GET", "/api/v1/admin/users", Admin, Api),
    r("POST", "/api/v1/admin/users", Admin, Api),
    r("PATCH", "/api/v1/admin/users/{name}", Admin, Api),
    r("DELETE", "/api/v1/admin/users/{name}", Admin, Api),
    r("PUT", "/api/v1/admin/users/{name}/grants/{collection}", Admin, Api),
    r("DELETE", "/api/v1/admin/users/{name}/grants/{collection}", Admin, Api),
    r("POST", "/api/v1/admin/users/{name}/tokens", Admin, Api),
    r("DELETE", "/api/v1/admin/tokens/{id}", Admin, Api),
    r("GET", "/api/v1/admin/models", Admin, Api),
    r("POST", "/api/v1/admin/models", Admin, Api),
    r("POST", "/api/v1/admin/models/evaluate", Admin, Api),
    r("GET", "/api/v1/admin/models/evaluations", Admin, Api),
    r("POST", "/api/v1/admin/models/promote", Admin, Api),
    r("POST", "/api/v1/admin/models/reject", Admin, Api),
    r("POST", "/api/v1/admin/models/rollback", Admin, Api),
    r("GET", "/api/v1/admin/models/history", Admin, Api),
    r("GET", "/api/v1/admin/judgments", Admin, Api),
    r("POST", "/api/v1/admin/collections/{name}/judgments/{set}", Admin, Api),
    r("DELETE", "/api/v1/admin/collections/{name}/judgments/{set}", Admin, Api),
    r("POST", "/api/v1/admin/models/activate", Admin, Api),
    r("GET", "/api/v1/admin/training", Admin, Api),
    r("POST", "/api/v1/admin/training/runs", Admin, Api),
    r("POST", "/api/v1/admin/training/embed-pending", Admin, Api),
    r("GET", "/api/v1/admin/training/runs/{job}", Admin, Api),
    r("GET", "/api/v1/admin/training/runs/{job}/loss.svg", Admin, Api),
    r("POST", "/api/v1/admin/training/schedules", Admin, Api),
    r("DELETE", "/api/v1/admin/training/schedules/{id}", Admin, Api),
    r("GET", "/api/v1/admin/audit", Admin, Api),
    r("GET", "/api/v1/admin/audit/verify", Admin, Api),
    r("GET", "/api/v1/admin/feedback", Admin, Api),
    r("GET", "/api/v1/admin/synonyms", Admin, Api),
    r("POST", "/api/v1/admin/synonyms", Admin, Api),
    r("GET", "/api/v1/admin/synonyms.csv", Admin, Api),
    r("POST", "/api/v1/admin/synonyms/import", Admin, Api),
    r("PUT", "/api/v1/admin/synonyms/{id}", Admin, Api),
    r("DELETE", "/api/v1/admin/synonyms/{id}", Admin, Api),
];

/// The entry for a matched pattern and method. `Err(true)` when the pattern is known but not for this method,
/// `Err(false)` when the pattern is not in the table at all.
pub fn lookup(method: &str, pattern: &str) -> Result<&'static Route, bool> {
    let mut known = false;
    for r in ROUTES {
        if r.pattern == pattern {
            if r.method == method || (method == "HEAD" && r.method == "GET") {
                return Ok(r);
            }
            known = true;
        }
    }
    Err(known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_duplicates_and_api_routes_are_api() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(!(a.method == b.method && a.pattern == b.pattern), "duplicate {} {}", a.method, a.pattern);
            }
            if a.pattern.starts_with("/api/") {
                assert_eq!(a.kind, Kind::Api, "{}", a.pattern);
            }
            if a.pattern.starts_with("/admin") || a.pattern.starts_with("/api/v1/admin") {
                // The backup routes admit administrators too, and besides them only a standby's token.
                let backups = a.method == "GET" && a.pattern.starts_with("/api/v1/admin/backups");
                assert_eq!(a.access, if backups { Access::Backups } else { Access::Admin }, "{}", a.pattern);
            }
        }
    }
}
