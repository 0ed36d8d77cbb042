//! The accounts handle: users and roles, sign-in (local, directory, OIDC), sessions, API tokens and read grants.

use super::*;

/// One way of hospital sign-in as the settings page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SignInSection {
    pub protocol: crate::directory::console::Protocol,
    /// Its key in forms and `care.toml` (`ldap`, `oidc`).
    pub key: &'static str,
    pub label: &'static str,
    pub enabled: bool,
    /// Who saved it in the console and when (local time); `None`: `care.toml`'s section applies.
    pub saved: Option<crate::directory::console::Saved>,
    pub fields: Vec<crate::directory::console::Field>,
}

/// What the sign-in page offers beside a local password.
#[derive(Debug, Clone, Serialize)]
pub struct SignInOptions {
    /// Names and passwords are checked against the hospital's directory (LDAP/AD).
    pub directory: bool,
    /// The button that starts an OpenID Connect sign-in, when one is configured.
    pub oidc_label: Option<String>,
}

impl crate::engine::Accounts<'_> {
    // -- accounts and sessions -------------------------------------------------------------------------------

    /// Creates the first administrator when there is no user; returns a generated password to show once.
    pub fn bootstrap_admin(&self, username: &str, password: Option<&str>) -> Result<Option<String>> {
        accounts::bootstrap_admin(self.store, username, password)
    }

    /// Checks a password (lockout, throttling and audit included) and opens a session: (user, cookie, CSRF token).
    pub fn login(
        &self,
        username: &str,
        password: &str,
        policy: LoginPolicy,
        client: &str,
    ) -> Result<(User, String, String)> {
        let sign_in = self.sign_in.get();
        let directory = sign_in.ldap.enabled().then_some(&sign_in.ldap as &dyn accounts::Directory);
        let u = accounts::authenticate(self.store, username, password, policy, client, directory)?;
        let (cookie, csrf) = accounts::create_session(self.store, &u)?;
        Ok((u, cookie, csrf))
    }

    /// The sign-in choices the login page offers beside a local password.
    pub fn sign_in_options(&self) -> SignInOptions {
        let s = self.sign_in.get();
        SignInOptions { directory: s.ldap.enabled(), oidc_label: s.oidc.enabled().then(|| s.oidc.button_label.clone()) }
    }

    /// Starts a sign-in at the hospital's OpenID Connect provider: where to send the browser, and the state the
    /// server binds to it.
    pub fn oidc_start(&self, next: &str) -> Result<crate::directory::oidc::Start> {
        self.oidc.start(&self.oidc_config()?, next)
    }

    /// Finishes it from the provider's callback: the answer verified, the account provisioned from the claims, a
    /// session opened. Returns (user, cookie, CSRF token, where the browser was going). A refused answer is audited.
    pub fn oidc_finish(&self, state: &str, code: &str, client: &str) -> Result<(User, String, String, String)> {
        let cfg = self.oidc_config()?;
        let (person, next) = match self.oidc.finish(&cfg, state, code) {
            Ok(v) => v,
            Err(e) => {
                if e.code() == crate::error::ErrorCode::Unauthenticated {
                    let detail = serde_json::json!({"reason": "oidc", "detail": e.to_string(), "client": client});
                    let mut conn = self.store.conn();
                    let tx = conn.transaction()?;
                    audit::append(&tx, "anonymous", "auth.login_failed", &detail)?;
                    tx.commit()?;
                }
                return Err(e);
            }
        };
        let u = crate::directory::provision(self.store, &person, &cfg.groups, client)?;
        let u = accounts::login_succeeded(self.store, &u, &u.username, client, accounts::unix_now())?;
        let (cookie, csrf) = accounts::create_session(self.store, &u)?;
        Ok((u, cookie, csrf, next))
    }

    /// Disables the LDAP accounts the directory no longer finds (also run by the housekeeping every six hours);
    /// returns their names.
    pub fn directory_sweep(&self, _admin: &Admin) -> Result<Vec<String>> {
        let s = self.sign_in.get();
        if !s.ldap.enabled() {
            return Err(Error::InvalidInput("未配置医院目录（LDAP/AD），无需同步".into()));
        }
        crate::directory::ldap::sweep(&s.ldap, self.store)
    }

    /// Checks an ID token against the configured provider as a callback would (signature, issuer, audience, expiry,
    /// nonce), without signing anyone in: `care doctor` and the tests use it.
    pub fn oidc_verify(&self, jwt: &str, nonce: &str) -> Result<crate::directory::DirectoryUser> {
        let cfg = self.oidc_config()?;
        let nonce = openidconnect::Nonce::new(nonce.to_string());
        self.oidc.with_verifier(&cfg, |v| crate::directory::oidc::verify_id_token(&cfg, v, jwt, &nonce))
    }

    /// The OpenID Connect section in force, or "not found" when sign-in through it is off.
    fn oidc_config(&self) -> Result<crate::directory::oidc::OidcConfig> {
        let s = self.sign_in.get();
        if !s.oidc.enabled() {
            return Err(Error::NotFound { what: "统一认证登录（未配置）".into() });
        }
        Ok(s.oidc.clone())
    }

    pub fn logout(&self, actor: &Actor, cookie: &str) -> Result<()> {
        accounts::end_session(self.store, cookie, &actor.name)
    }

    pub fn session(&self, cookie: &str, idle_seconds: i64, max_seconds: i64) -> Result<Option<Session>> {
        accounts::session(self.store, cookie, idle_seconds, max_seconds)
    }

    pub fn token_user(&self, secret: &str) -> Result<Option<User>> {
        accounts::token_user(self.store, secret)
    }

    /// The user of a bearer token and what the token opens.
    pub fn token_caller(&self, secret: &str) -> Result<Option<(User, accounts::TokenScope)>> {
        accounts::token_caller(self.store, secret)
    }

    pub fn purge_sessions(&self, idle_seconds: i64, max_seconds: i64) -> Result<usize> {
        accounts::purge_sessions(self.store, idle_seconds, max_seconds)
    }

    /// A user's own password change; the current password is checked and throttled like a sign-in from `client`.
    pub fn change_own_password(
        &self,
        actor: &Actor,
        current: &str,
        new: &str,
        policy: LoginPolicy,
        client: &str,
    ) -> Result<()> {
        let current = accounts::CurrentPassword { password: current, policy, client };
        accounts::set_password(self.store, &actor.name, &actor.name, Some(current), new, false)
    }

    pub fn users(&self, _admin: &Admin) -> Result<Vec<UserInfo>> {
        let now = accounts::unix_now();
        accounts::list_users(self.store)?
            .into_iter()
            .map(|u| {
                Ok(UserInfo {
                    collections: accounts::granted_collections(self.store, u.id)?,
                    locked: u.is_locked(now),
                    username: u.username,
                    role: u.role.as_str().into(),
                    created_at: u.created_at,
                    disabled: u.disabled,
                    failed_logins: u.failed_logins,
                    must_change_password: u.must_change_password,
                    source: u.source.as_str().into(),
                    source_zh: u.source.label_zh().into(),
                    display_name: u.display_name,
                    groups: u.groups,
                })
            })
            .collect()
    }

    /// Creates an account. Its password is temporary (replaced at the first sign-in: the admin who chose it knows
    /// it) unless `permanent`.
    pub fn create_user(
        &self,
        actor: &Admin,
        username: &str,
        password: &str,
        role: &str,
        permanent: bool,
    ) -> Result<User> {
        accounts::create_user(self.store, &actor.name, username.trim(), password, Role::parse(role)?, !permanent)
    }

    /// Role, disabled flag, lock, or a password reset: each a separate change with its own audit record.
    pub fn update_user(&self, actor: &Admin, username: &str, u: &UserUpdate) -> Result<()> {
        let role = u.role.as_deref().filter(|r| !r.is_empty()).map(Role::parse).transpose()?;
        if role.is_some() || u.disabled.is_some() || u.unlock {
            accounts::update_user(self.store, &actor.name, username, role, u.disabled, u.unlock)?;
        }
        if let Some(pw) = u.password.as_deref().filter(|p| !p.is_empty()) {
            accounts::set_password(self.store, &actor.name, username, None, pw, u.permanent)?;
        }
        if let Some(g) = &u.groups {
            accounts::set_groups(self.store, &actor.name, username, g)?;
        }
        Ok(())
    }

    pub fn delete_user(&self, actor: &Admin, username: &str) -> Result<()> {
        accounts::delete_user(self.store, &actor.name, username)
    }

    pub fn grant(&self, actor: &Admin, username: &str, collection: &str) -> Result<()> {
        accounts::grant(self.store, &actor.name, username, collection)
    }

    pub fn revoke(&self, actor: &Admin, username: &str, collection: &str) -> Result<()> {
        accounts::revoke(self.store, &actor.name, username, collection)
    }

    /// Issues an API token for `username`; the secret is returned once.
    pub fn create_token(&self, actor: &Admin, username: &str, name: &str) -> Result<(ApiToken, String)> {
        accounts::create_token(self.store, &actor.name, username, name)
    }

    /// A token that opens only `scope` (a standby's: listing and downloading backups).
    pub fn create_scoped_token(
        &self,
        actor: &Admin,
        username: &str,
        name: &str,
        scope: accounts::TokenScope,
    ) -> Result<(ApiToken, String)> {
        accounts::create_scoped_token(self.store, &actor.name, username, name, scope)
    }

    pub fn revoke_token(&self, actor: &Admin, id: i64) -> Result<()> {
        accounts::revoke_token(self.store, &actor.name, id)
    }

    pub fn tokens(&self, _admin: &Admin, username: Option<&str>) -> Result<Vec<ApiToken>> {
        accounts::list_tokens(self.store, username)
    }
}
