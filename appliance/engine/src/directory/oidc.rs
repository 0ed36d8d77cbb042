//! OpenID Connect sign-in (`[oidc]` in care.toml) against the hospital's single sign-on platform: the
//! authorization-code flow with PKCE, the provider found by discovery, its ID token checked for signature (the
//! provider's published keys), issuer, audience, expiry and the nonce this appliance sent.
//!
//! A sign-in in flight is kept in memory under its random `state` for ten minutes; the server also binds that state
//! to the browser that started it (a cookie), so a callback link sent to someone else signs no one in.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openidconnect::core::{CoreAuthenticationFlow, CoreClient, CoreProviderMetadata};
use openidconnect::{
    AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointMaybeSet, EndpointNotSet, EndpointSet, IssuerUrl,
    Nonce, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope,
};
use serde::{Deserialize, Serialize};

use super::{AccountSource, DirectoryUser, GroupMapping};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct OidcConfig {
    /// The provider's issuer URL (discovery reads `{issuer}/.well-known/openid-configuration`). Empty: off.
    pub issuer: String,
    pub client_id: String,
    /// Never shown back (`care config` prints `***` when set).
    pub client_secret: String,
    /// This appliance's callback as registered at the provider: `https://<host>/login/oidc/callback`.
    pub redirect_url: String,
    /// Scopes beyond `openid`.
    pub scopes: Vec<String>,
    /// The claim whose value becomes the account name here.
    pub username_claim: String,
    pub display_claim: String,
    /// The claim listing the person's groups (a list of strings).
    pub groups_claim: String,
    /// PEM file of the CA that signed the provider's certificate; empty: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The sign-in page's button.
    pub button_label: String,
    pub groups: GroupMapping,
}

impl Default for OidcConfig {
    fn default() -> Self {
        OidcConfig {
            issuer: String::new(),
            client_id: String::new(),
            client_secret: String::new(),
            redirect_url: String::new(),
            scopes: vec!["profile".into(), "email".into(), "groups".into()],
            username_claim: "preferred_username".into(),
            display_claim: "name".into(),
            groups_claim: "groups".into(),
            ca_file: None,
            button_label: "统一身份认证登录".into(),
            groups: GroupMapping::default(),
        }
    }
}

impl OidcConfig {
    pub fn enabled(&self) -> bool {
        !self.issuer.trim().is_empty()
    }
    pub fn validate(&self) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let bad = |m: &str| Err(Error::InvalidInput(format!("[oidc] 配置有误：{m}")));
        if IssuerUrl::new(self.issuer.clone()).is_err() || RedirectUrl::new(self.redirect_url.clone()).is_err() {
            return bad("issuer 与 redirect_url 必须是完整的 URL");
        }
        if self.client_id.is_empty() {
            return bad("client_id 不能为空");
        }
        Ok(())
    }
}

/// How long a started sign-in may take, and how many may be in flight (each holds a PKCE verifier and a nonce).
const PENDING_TTL: Duration = Duration::from_secs(600);
const MAX_PENDING: usize = 10_000;
/// The provider's metadata and keys are read again after this long (keys rotate).
const METADATA_TTL: Duration = Duration::from_secs(300);

/// The client as discovery configures it: authorization endpoint set, token and user-info endpoints as published.
type Client =
    CoreClient<EndpointSet, EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointMaybeSet, EndpointMaybeSet>;

struct Pending {
    verifier: PkceCodeVerifier,
    nonce: Nonce,
    next: String,
    started: Instant,
}

/// Sign-ins in flight and the provider's cached metadata; one per engine.
#[derive(Default)]
pub struct OidcState {
    pending: Mutex<HashMap<String, Pending>>,
    metadata: Mutex<Option<(Instant, String, CoreProviderMetadata)>>,
}

/// Where to send the browser, and the state to bind to it.
#[derive(Debug, Clone)]
pub struct Start {
    pub url: String,
    pub state: String,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    tracing::warn!(error = %e, "oidc: {what}");
    Error::Directory(format!("统一认证平台{what}，请稍后再试或联系信息科"))
}

/// A token that fails a check: the person is asked to sign in again; the reason goes to the log and the audit.
fn refused(reason: impl std::fmt::Display) -> Error {
    tracing::warn!(%reason, "oidc: token refused");
    Error::LoginFailed(format!("统一认证返回的登录凭据未通过校验（{reason}），请重新登录"))
}

fn http_client(cfg: &OidcConfig) -> Result<reqwest::blocking::Client> {
    // No redirects: a token endpoint that redirects could leak the code elsewhere (the crate's own advice).
    let mut b = reqwest::blocking::ClientBuilder::new()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10));
    if let Some(ca) = &cfg.ca_file {
        let pem = std::fs::read(ca).map_err(|e| Error::io(ca, e))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| Error::InvalidInput(format!("CA 证书文件 {} 无效：{e}", ca.display())))?
        {
            b = b.add_root_certificate(cert);
        }
    }
    b.build().map_err(|e| unavailable("无法连接", e))
}

impl OidcState {
    fn metadata(&self, cfg: &OidcConfig, http: &reqwest::blocking::Client) -> Result<CoreProviderMetadata> {
        let mut cached = self.metadata.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, issuer, m)) = cached.as_ref()
            && at.elapsed() < METADATA_TTL
            && *issuer == cfg.issuer
        {
            return Ok(m.clone());
        }
        let issuer = IssuerUrl::new(cfg.issuer.clone()).map_err(|e| unavailable("地址有误", e))?;
        let m = CoreProviderMetadata::discover(&issuer, http).map_err(|e| unavailable("无法读取配置", e))?;
        *cached = Some((Instant::now(), cfg.issuer.clone(), m.clone()));
        Ok(m)
    }

    fn client(&self, cfg: &OidcConfig, http: &reqwest::blocking::Client) -> Result<Client> {
        let redirect = RedirectUrl::new(cfg.redirect_url.clone()).map_err(|e| unavailable("回调地址有误", e))?;
        Ok(CoreClient::from_provider_metadata(
            self.metadata(cfg, http)?,
            ClientId::new(cfg.client_id.clone()),
            Some(ClientSecret::new(cfg.client_secret.clone())),
        )
        .set_redirect_uri(redirect))
    }

    /// Starts a sign-in: the provider URL to send the browser to, with PKCE challenge, state and nonce.
    pub fn start(&self, cfg: &OidcConfig, next: &str) -> Result<Start> {
        let http = http_client(cfg)?;
        let client = self.client(cfg, &http)?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut req = client
            .authorize_url(CoreAuthenticationFlow::AuthorizationCode, CsrfToken::new_random, Nonce::new_random)
            .set_pkce_challenge(challenge);
        for s in &cfg.scopes {
            req = req.add_scope(Scope::new(s.clone()));
        }
        let (url, state, nonce) = req.url();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|_, p| p.started.elapsed() < PENDING_TTL);
        if pending.len() >= MAX_PENDING {
            return Err(Error::Overloaded("正在进行的统一认证登录过多，请稍后再试".into()));
        }
        let p = Pending { verifier, nonce, next: next.to_string(), started: Instant::now() };
        pending.insert(state.secret().clone(), p);
        Ok(Start { url: url.to_string(), state: state.secret().clone() })
    }

    /// Finishes a sign-in from the provider's callback: exchanges the code (with the PKCE verifier), verifies the
    /// ID token and reads the person from its claims. Returns them and where the browser was going.
    pub fn finish(&self, cfg: &OidcConfig, state: &str, code: &str) -> Result<(DirectoryUser, String)> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(state);
        let Some(p) = pending.filter(|p| p.started.elapsed() < PENDING_TTL) else {
            return Err(refused("登录请求已过期或不是从本系统发起的"));
        };
        let http = http_client(cfg)?;
        let client = self.client(cfg, &http)?;
        let token = client
            .exchange_code(AuthorizationCode::new(code.to_string()))
            .map_err(|e| unavailable("没有令牌端点", e))?
            .set_pkce_verifier(p.verifier)
            .request(&http)
            .map_err(|e| refused(format!("授权码换取令牌失败：{e}")))?;
        let id_token = openidconnect::TokenResponse::id_token(&token).ok_or_else(|| refused("缺少身份令牌"))?;
        let user = verify_id_token(cfg, &client.id_token_verifier(), &id_token.to_string(), &p.nonce)?;
        Ok((user, p.next))
    }
}

/// Whether the provider of `cfg` answers: its discovery document read over a checked connection (the settings page
/// saves no section that fails it).
pub fn probe(cfg: &OidcConfig) -> Result<()> {
    let http = http_client(cfg)?;
    let issuer = IssuerUrl::new(cfg.issuer.clone()).map_err(|e| unavailable("地址有误", e))?;
    CoreProviderMetadata::discover(&issuer, &http).map_err(|e| unavailable("无法读取配置", e))?;
    Ok(())
}

/// Verifies an ID token (signature, issuer, audience, expiry, nonce) and reads the person from its claims. Claims
/// beyond the standard ones (groups) are read from the very token whose signature was just checked.
pub fn verify_id_token(
    cfg: &OidcConfig,
    verifier: &openidconnect::core::CoreIdTokenVerifier<'_>,
    jwt: &str,
    nonce: &Nonce,
) -> Result<DirectoryUser> {
    let token: openidconnect::core::CoreIdToken = jwt.parse().map_err(|e| refused(format!("格式错误：{e}")))?;
    token.claims(verifier, nonce).map_err(|e| refused(e))?;
    let payload = jwt.split('.').nth(1).ok_or_else(|| refused("格式错误"))?;
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| refused(format!("格式错误：{e}")))?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| refused(format!("格式错误：{e}")))?;
    let text = |name: &str| claims.get(name).and_then(|v| v.as_str()).map(str::to_string);
    let username = text(&cfg.username_claim).ok_or_else(|| refused(format!("缺少 {} 声明", cfg.username_claim)))?;
    let groups = match claims.get(&cfg.groups_claim) {
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    };
    Ok(DirectoryUser { source: AccountSource::Oidc, username, display_name: text(&cfg.display_claim), groups })
}

impl OidcState {
    /// The verifier for tokens of the configured provider (tests use it to check tokens they obtained or forged).
    pub fn with_verifier<T>(
        &self,
        cfg: &OidcConfig,
        f: impl FnOnce(&openidconnect::core::CoreIdTokenVerifier<'_>) -> Result<T>,
    ) -> Result<T> {
        let http = http_client(cfg)?;
        f(&self.client(cfg, &http)?.id_token_verifier())
    }
}
