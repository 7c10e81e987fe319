// A real OpenID provider for the tests: panva's `oidc-provider` (pinned in package.json next
// to this file), served on 127.0.0.1 with minimal interactions a test drives with plain HTTP
// form posts, and test-only faults in the ID token of the token endpoint's answer.
//
//   node provider.mjs [--port N] [--config JSON] [--modules DIR]
//
// --port (or OIDC_PROVIDER_PORT): the port to listen on; 0 (the default) picks a free one.
// --config (or OIDC_PROVIDER_CONFIG): JSON with
//   issuer       the Issuer Identifier the provider claims (default: the URL it listens on);
//                "{port}" and "{url}" in it become the port and URL it listens on, so it may
//                deliberately differ from where it listens (another host, a path)
//   clients      [{client_id, client_secret, redirect_uris,
//                  token_endpoint_auth_method: client_secret_basic | client_secret_post,
//                  post_logout_redirect_uris?}]
//   accounts     [{sub, email, email_verified, name}]
//   signing_key  a private JWK (RSA, EC P-256) signing ID tokens; an RSA key is generated
//                at start when absent
//   cookie_keys  the keys signing the provider's cookies (random when absent)
// --modules (or OIDC_PROVIDER_MODULES): the folder whose node_modules holds oidc-provider
//   (where tests/support/oidc_provider.py installed package.json); else the usual lookup.
//
// Once listening it prints one JSON line on stdout:
//   {"event": "listening", "url": "http://127.0.0.1:PORT", "port": PORT, "issuer": ..., "kid": ...}
// and logs one line per request on stderr. It exits on SIGTERM/SIGINT or when its stdin
// closes (its parent died).
//
// Interactions (the provider's own session, cookies and redirects around them):
//   GET  /interaction/:uid         the login form (<form id="login">: fields `login`, the
//                                  account's sub, and `password`, ignored) or, when consent
//                                  is what is pending, consent granted at once for what was
//                                  asked (openid email profile) and a 303 onwards
//   POST /interaction/:uid/login   an unknown `login` gets the form again with status 401
//   POST /interaction/:uid/abort   the person cancels: the client gets error=access_denied
//
// Test-only (loopback callers only):
//   GET  /__test/mode              {"mode", "once", "applied"}
//   POST /__test/mode  {"mode": M, "once": true|false}
//     the ID token of the next token response (once, the default) or of every one until
//     the mode is set back to "normal" (once: false) gets the defect M names:
//       normal          none
//       wrong_audience  aud is another client's id (re-signed with the provider's key)
//       wrong_issuer    iss is WRONG_ISSUER below (re-signed)
//       expired         exp an hour ago, iat its lifetime before (re-signed)
//       unsigned        header {"alg": "none"} and an empty signature
//       bad_signature   signed by another key (same kid and alg), not in the JWKS
//       wrong_nonce     nonce is another value (re-signed)

import * as crypto from 'node:crypto';
import * as http from 'node:http';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';

const WRONG_ISSUER = 'https://wrong-issuer.invalid';
const OTHER_AUDIENCE = 'another-client';
const MODES = new Set([
  'normal', 'wrong_audience', 'wrong_issuer', 'expired', 'unsigned', 'bad_signature', 'wrong_nonce',
]);
const LOOPBACK = new Set(['127.0.0.1', '::1', '::ffff:127.0.0.1']);

function option(name, variable) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 ? process.argv[at + 1] : process.env[variable];
}

const config = JSON.parse(option('config', 'OIDC_PROVIDER_CONFIG') ?? '{}');
const port = Number(option('port', 'OIDC_PROVIDER_PORT') ?? 0);
const modules = option('modules', 'OIDC_PROVIDER_MODULES');

async function loadProvider() {
  if (modules) {
    const require = createRequire(path.join(path.resolve(modules), 'package.json'));
    return (await import(pathToFileURL(require.resolve('oidc-provider')).href)).default;
  }
  return (await import('oidc-provider')).default;
}

function rsaJwk(kid) {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' };
}

const signingJwk = config.signing_key
  ? { use: 'sig', kid: `test-${crypto.randomBytes(6).toString('hex')}`, ...config.signing_key }
  : rsaJwk(`test-${crypto.randomBytes(6).toString('hex')}`);
const signingKey = crypto.createPrivateKey({ key: signingJwk, format: 'jwk' });
let strangerKey; // bad_signature's: made on first use

const idTokenAlg = signingJwk.alg ?? (signingJwk.kty === 'EC' ? 'ES256' : 'RS256');
const clients = (config.clients ?? []).map((client) => ({
  client_id: client.client_id,
  client_secret: client.client_secret,
  redirect_uris: client.redirect_uris,
  post_logout_redirect_uris: client.post_logout_redirect_uris ?? [],
  token_endpoint_auth_method: client.token_endpoint_auth_method ?? 'client_secret_basic',
  grant_types: ['authorization_code'],
  response_types: ['code'],
  id_token_signed_response_alg: idTokenAlg,
}));
const accounts = new Map((config.accounts ?? []).map((account) => [account.sub, account]));

const fault = { mode: 'normal', once: true, applied: 0 };

// --- JWS by hand (the faults re-sign what the provider issued) -----------------------------

const b64 = (data) => Buffer.from(data).toString('base64url');
const unb64json = (part) => JSON.parse(Buffer.from(part, 'base64url').toString('utf8'));

function signJws(header, payload, key) {
  const input = `${b64(JSON.stringify(header))}.${b64(JSON.stringify(payload))}`;
  const alg = header.alg;
  const hash = `sha${alg.slice(2)}`;
  let options = key;
  if (alg.startsWith('PS')) {
    options = { key, padding: crypto.constants.RSA_PKCS1_PSS_PADDING, saltLength: Number(alg.slice(2)) / 8 };
  } else if (alg.startsWith('ES')) {
    options = { key, dsaEncoding: 'ieee-p1363' };
  } else if (!alg.startsWith('RS')) {
    throw new Error(`cannot re-sign an ID token signed with ${alg}`);
  }
  return `${input}.${crypto.sign(hash, Buffer.from(input), options).toString('base64url')}`;
}

function strangerKeyLike() {
  if (!strangerKey) {
    strangerKey = signingJwk.kty === 'EC'
      ? crypto.generateKeyPairSync('ec', { namedCurve: signingJwk.crv === 'P-256' ? 'prime256v1' : signingJwk.crv }).privateKey
      : crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
  }
  return strangerKey;
}

function withDefect(mode, idToken) {
  const [headerPart, payloadPart] = idToken.split('.');
  const header = unb64json(headerPart);
  const payload = unb64json(payloadPart);
  switch (mode) {
    case 'wrong_audience': {
      const other = clients.find((client) => client.client_id !== payload.aud);
      payload.aud = other ? other.client_id : OTHER_AUDIENCE;
      delete payload.azp;
      break;
    }
    case 'wrong_issuer':
      payload.iss = WRONG_ISSUER;
      break;
    case 'expired': {
      const lifetime = payload.exp - payload.iat;
      payload.exp = Math.floor(Date.now() / 1000) - 3600;
      payload.iat = payload.exp - lifetime;
      if (payload.auth_time > payload.iat) payload.auth_time = payload.iat;
      break;
    }
    case 'unsigned': {
      const unsigned = { alg: 'none' };
      if (header.typ) unsigned.typ = header.typ;
      return `${b64(JSON.stringify(unsigned))}.${payloadPart}.`;
    }
    case 'bad_signature':
      return signJws(header, payload, strangerKeyLike());
    case 'wrong_nonce':
      payload.nonce = `wrong-${crypto.randomBytes(8).toString('base64url')}`;
      break;
    default:
      throw new Error(`no such mode: ${mode}`);
  }
  return signJws(header, payload, signingKey);
}

// --- small HTTP helpers --------------------------------------------------------------------

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function loginPage(uid, details, message) {
  const client = escape(details.params.client_id);
  const scope = escape(details.params.scope ?? '');
  return `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Sign in</title></head>
<body>
<h1>Sign in to ${client}</h1>
<p>Asks for: ${scope}</p>
${message ? `<p id="message" role="alert">${escape(message)}</p>` : ''}
<form id="login" method="post" action="/interaction/${escape(uid)}/login" autocomplete="off">
  <label>Account <input name="login" required autofocus></label>
  <label>Password <input name="password" type="password"></label>
  <button type="submit">Sign in</button>
</form>
<form id="abort" method="post" action="/interaction/${escape(uid)}/abort">
  <button type="submit">Cancel</button>
</form>
</body></html>`;
}

function redirect(ctx, location) {
  ctx.status = 303;
  ctx.redirect(location);
}

// --- the provider --------------------------------------------------------------------------

const Provider = await loadProvider();

const server = http.createServer();
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(port, '127.0.0.1', resolve);
});
const listening = server.address().port;
const url = `http://127.0.0.1:${listening}`;
const issuer = (config.issuer ?? url).replaceAll('{port}', String(listening)).replaceAll('{url}', url);

const cookieOptions = { httpOnly: true, sameSite: 'lax', secure: false };

const provider = new Provider(issuer, {
  clients,
  clientAuthMethods: ['client_secret_basic', 'client_secret_post'],
  responseTypes: ['code'],
  scopes: ['openid', 'email', 'profile'],
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
  // The scopes' claims go into the ID token too (not only userinfo's answer).
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  // Lifetimes in seconds: the defaults' values, given so the provider logs no notice for each.
  ttl: {
    AccessToken: 3600, AuthorizationCode: 60, IdToken: 3600, Interaction: 3600, Session: 1209600, Grant: 1209600,
  },
  jwks: { keys: [signingJwk] },
  cookies: {
    keys: config.cookie_keys ?? [crypto.randomBytes(32).toString('base64url')],
    long: cookieOptions,
    short: cookieOptions,
  },
  features: { devInteractions: { enabled: false } },
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(_ctx, sub) {
    const account = accounts.get(sub);
    if (!account) return undefined;
    return {
      accountId: sub,
      async claims() {
        return {
          sub,
          email: account.email,
          email_verified: account.email_verified ?? true,
          name: account.name,
        };
      },
    };
  },
  async renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = `<!DOCTYPE html><html><head><title>oops</title></head><body><pre id="error">${
      Object.entries(out).map(([k, v]) => `${escape(k)}: ${escape(v)}`).join('\n')
    }</pre></body></html>`;
  },
});

async function testEndpoint(ctx) {
  if (!LOOPBACK.has(ctx.req.socket.remoteAddress)) {
    ctx.status = 403;
    return;
  }
  if (ctx.path !== '/__test/mode') {
    ctx.status = 404;
    return;
  }
  if (ctx.method === 'POST') {
    let asked;
    try {
      asked = JSON.parse(await readBody(ctx.req));
    } catch {
      asked = {};
    }
    if (!MODES.has(asked.mode)) {
      ctx.status = 400;
      ctx.body = { error: `mode must be one of ${[...MODES].join(', ')}` };
      return;
    }
    fault.mode = asked.mode;
    fault.once = asked.once ?? true;
  } else if (ctx.method !== 'GET') {
    ctx.status = 405;
    return;
  }
  ctx.body = { ...fault };
}

async function interaction(ctx, uid, action) {
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (details.uid !== uid) {
    ctx.status = 400;
    ctx.body = 'this interaction is not the one in progress';
    return;
  }
  const { prompt, params } = details;
  if (ctx.method === 'GET' && !action) {
    if (prompt.name === 'login') {
      ctx.type = 'html';
      ctx.body = loginPage(uid, details);
      return;
    }
    if (prompt.name === 'consent') {
      // Granted at once: everything the client asked for that is not granted yet.
      const grant = details.grantId
        ? await provider.Grant.find(details.grantId)
        : new provider.Grant({ accountId: details.session.accountId, clientId: params.client_id });
      if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
      if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
      for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes ?? {})) {
        grant.addResourceScope(indicator, scopes.join(' '));
      }
      const grantId = await grant.save();
      const consent = details.grantId ? {} : { grantId };
      redirect(ctx, await provider.interactionResult(ctx.req, ctx.res, { consent }, { mergeWithLastSubmission: true }));
      return;
    }
    ctx.status = 501;
    ctx.body = `no interaction for prompt ${prompt.name}`;
    return;
  }
  if (ctx.method === 'POST' && action === '/login') {
    const form = new URLSearchParams(await readBody(ctx.req));
    const sub = form.get('login') ?? '';
    if (prompt.name !== 'login' || !accounts.has(sub)) {
      ctx.status = 401;
      ctx.type = 'html';
      ctx.body = loginPage(uid, details, prompt.name !== 'login' ? 'not signing in now' : `no account ${sub}`);
      return;
    }
    const result = { login: { accountId: sub } };
    redirect(ctx, await provider.interactionResult(ctx.req, ctx.res, result, { mergeWithLastSubmission: false }));
    return;
  }
  if (ctx.method === 'POST' && action === '/abort') {
    const result = { error: 'access_denied', error_description: 'End-User aborted interaction' };
    redirect(ctx, await provider.interactionResult(ctx.req, ctx.res, result, { mergeWithLastSubmission: false }));
    return;
  }
  ctx.status = 405;
}

provider.use(async (ctx, next) => {
  const started = Date.now();
  try {
    if (ctx.path.startsWith('/__test/')) {
      await testEndpoint(ctx);
      return;
    }
    const match = ctx.path.match(/^\/interaction\/([^/]+)(\/login|\/abort)?$/);
    if (match) {
      try {
        await interaction(ctx, match[1], match[2]);
      } catch (error) {
        // No interaction cookie, an expired interaction: the provider's own error page.
        if (error.name !== 'SessionNotFound') throw error;
        ctx.status = 400;
        ctx.type = 'html';
        ctx.body = `<!DOCTYPE html><pre id="error">error: invalid_request\nerror_description: ${escape(error.error_description ?? error.message)}</pre>`;
      }
      return;
    }
    await next();
    if (
      ctx.oidc?.route === 'token' && ctx.status === 200 && fault.mode !== 'normal'
      && typeof ctx.body?.id_token === 'string'
    ) {
      ctx.body = { ...ctx.body, id_token: withDefect(fault.mode, ctx.body.id_token) };
      fault.applied += 1;
      if (fault.once) fault.mode = 'normal';
    }
  } finally {
    process.stderr.write(`${ctx.method} ${ctx.path} -> ${ctx.status} (${Date.now() - started} ms)\n`);
  }
});

provider.on('server_error', (_ctx, error) => {
  process.stderr.write(`server_error: ${error.stack ?? error}\n`);
});

server.on('request', provider.callback());

function stop() {
  server.close();
  server.closeAllConnections();
  process.exit(0);
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
process.stdin.on('end', stop);
process.stdin.on('error', stop);
process.stdin.resume();

process.stdout.write(`${JSON.stringify({
  event: 'listening', url, port: listening, issuer, kid: signingJwk.kid,
})}\n`);
