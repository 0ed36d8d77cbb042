// A real OpenID Connect provider for the directory sign-in tests: panva's node-oidc-provider (OpenID-certified),
// configured like a hospital's 统一认证 platform with a few staff accounts and their groups.
//
//   node provider.mjs <port> <client_id> <client_secret> <redirect_uri>
//
// Prints "issuer <url>" once it listens. The person "types their password" by posting login=<account> to the
// interaction page (the provider's own login UI is not what is under test). For the token checks it also serves
// POST /test/sign: an ID token with the claims posted, signed with the provider's own key (to test expiry, nonce
// and audience checks on a token whose signature is genuine).
import http from 'node:http';
import crypto from 'node:crypto';
import Provider from 'oidc-provider';
import * as jose from 'jose';

const [port, clientId, clientSecret, redirectUri] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

const people = {
  'dr.li': { name: '李医生', groups: ['staff', 'cardiology'] },
  'chief.zhao': { name: '赵主任', groups: ['staff', 'care-admins'] },
  'visitor.sun': { name: '孙访客', groups: ['visitors'] },
  'admin': { name: '与本地管理员重名', groups: ['staff', 'care-admins'] },
};

const { privateKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key-1', alg: 'ES256', use: 'sig' };

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    id_token_signed_response_alg: 'ES256',
  }],
  jwks: { keys: [jwk] },
  pkce: { required: () => true },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: { openid: ['sub'], profile: ['name', 'preferred_username'], email: ['email'], groups: ['groups'] },
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: false } },
  async findAccount(ctx, id) {
    const p = people[id];
    if (!p) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, preferred_username: id, name: p.name, email: `${id}@hospital.test`, groups: p.groups };
      },
    };
  },
  // Consent is the hospital's business, not this client's: every scope is granted at once.
  async loadExistingGrant(ctx) {
    const id = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (id) return ctx.oidc.provider.Grant.find(id);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid profile email groups');
    grant.addOIDCClaims(['sub', 'name', 'preferred_username', 'email', 'groups']);
    await grant.save();
    return grant;
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
});

async function body(req) {
  let s = '';
  for await (const chunk of req) s += chunk;
  return s;
}

const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, issuer);
    const m = url.pathname.match(/^\/interaction\/([^/]+)(\/login)?$/);
    if (m && req.method === 'GET') {
      await provider.interactionDetails(req, res);
      res.setHeader('content-type', 'text/html; charset=utf-8');
      res.end(`<form method="post" action="/interaction/${m[1]}/login"><input name="login"><button>登录</button></form>`);
      return;
    }
    if (m && m[2] && req.method === 'POST') {
      const login = new URLSearchParams(await body(req)).get('login');
      if (!people[login]) {
        res.statusCode = 401;
        res.end('unknown account');
        return;
      }
      await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
      return;
    }
    if (url.pathname === '/test/sign' && req.method === 'POST') {
      const claims = JSON.parse(await body(req));
      const key = await jose.importJWK(jwk, 'ES256');
      const token = await new jose.SignJWT(claims).setProtectedHeader({ alg: 'ES256', kid: jwk.kid }).sign(key);
      res.end(token);
      return;
    }
    provider.callback()(req, res);
  } catch (e) {
    res.statusCode = 500;
    res.end(String(e));
  }
});
server.listen(Number(port), '127.0.0.1', () => console.log(`issuer ${issuer}`));
