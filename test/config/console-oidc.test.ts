/**
 * `api.console.oidc`: what a valid section compiles to, each problem reported at its path in one
 * `config_invalid` at start, the mapping from claims to a principal and roles, and the client secret read at
 * start (`secret_missing`, never the value in an error).
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { oidcMapping } from '../../config/index.js';
import { oidcClientSecret } from '../../server/console/oidc.js';
import { testConfig } from '../helpers/db.js';

const URL_ = 'postgres://localhost/unused';

const valid = {
  issuer: 'https://idp.example.com/oauth2/default',
  client_id: 'ledger',
  client_secret_env: 'OIDC_SECRET',
  redirect_url: 'https://ledger.example.com/console/oidc/callback',
  tenants: {
    'tenant-a': [
      { subject: '00u1', principal: 'alice', roles: ['operator', 'approver'] },
      { group: 'ledger-auditors', roles: ['auditor'] },
    ],
    'tenant-b': [{ group: 'ledger-auditors', roles: ['auditor'] }],
  },
};

const withOidc = (oidc: Record<string, unknown>) => testConfig(URL_, { api: { console: { oidc } } });

function issues(oidc: Record<string, unknown>): { path: string; message: string }[] {
  try {
    withOidc(oidc);
  } catch (err) {
    return (err as { details: { issues: { path: string; message: string }[] } }).details.issues;
  }
  return [];
}

t.test('a valid section compiles, with its defaults; none means off', (t) => {
  t.equal(testConfig(URL_).api.console.oidc, null);
  const c = withOidc(valid).api.console.oidc;
  t.match(c, {
    displayName: 'single sign-on',
    issuer: valid.issuer,
    clientSecretEnv: 'OIDC_SECRET',
    clientSecretFile: null,
    scopes: ['openid', 'email', 'profile'],
    principalClaim: 'sub',
    groupsClaim: 'groups',
  });
  t.same([...(c?.tenants.keys() ?? [])], ['tenant-a', 'tenant-b']);
  t.same(withOidc({ ...valid, issuer: 'http://127.0.0.1:9000' }).api.console.oidc?.issuer, 'http://127.0.0.1:9000');
  t.end();
});

t.test('each problem is reported at its path, all in one config_invalid', (t) => {
  const found = issues({
    ...valid,
    issuer: 'http://idp.example.com',
    redirect_url: 'https://ledger.example.com/elsewhere',
    client_secret_file: '/run/secrets/oidc',
    scopes: ['email'],
    tenants: {
      'tenant-a': [
        { subject: '00u1', group: 'both', principal: 'alice', roles: ['operator'] },
        { group: 'g', principal: 'bob', roles: ['auditor'] },
        { subject: '00u1', principal: 'mallory', roles: ['auditor'] },
        { subject: '00u2', roles: ['bad\u200Brole'] },
      ],
    },
  });
  t.same(
    found.map((i) => i.path),
    [
      '/api/console/oidc/issuer',
      '/api/console/oidc/redirect_url',
      '/api/console/oidc/client_secret_env',
      '/api/console/oidc/scopes',
      '/api/console/oidc/tenants/tenant-a/0',
      '/api/console/oidc/tenants/tenant-a/1/principal',
      '/api/console/oidc/tenants/tenant-a/2/principal',
      '/api/console/oidc/tenants/tenant-a/3/roles',
    ],
  );
  t.match(found[0]?.message, /https/);
  t.match(found[2]?.message, /exactly one of client_secret_env and client_secret_file/);
  t.match(found[6]?.message, /mapped to alice elsewhere/);
  t.match(issues({ ...valid, tenants: {} }), [{ path: '/api/console/oidc/tenants' }], 'a mapping is required');
  t.match(issues({ ...valid, unknown: 1 }), [{ path: '/api/console/oidc/unknown', message: /not a known key/ }]);
  const { client_id: _, ...noClient } = valid;
  t.match(issues(noClient), [{ path: '/api/console/oidc/client_id', message: 'is required' }]);
  t.end();
});

t.test('the mapping: a subject rule names the principal, group rules add roles, per tenant', (t) => {
  const c = withOidc(valid).api.console.oidc;
  const alice = oidcMapping(c, { subject: '00u1', groups: ['ledger-auditors'] });
  t.equal(alice.principal, 'alice');
  t.same(
    [...alice.grants],
    [
      ['tenant-a', ['approver', 'auditor', 'operator']],
      ['tenant-b', ['auditor']],
    ],
  );
  const bob = oidcMapping(c, { subject: '00u9', groups: ['ledger-auditors', 'other'] });
  t.equal(bob.principal, null, 'no subject rule: the principal claim decides');
  t.same([...bob.grants.keys()], ['tenant-a', 'tenant-b']);
  t.same([...oidcMapping(c, { subject: '00u9', groups: ['other'] }).grants], [], 'no rule matches: nothing');
  t.same([...oidcMapping(null, { subject: '00u1', groups: [] }).grants], [], 'single sign-on off: nothing');
  t.end();
});

t.test('the client secret is read at start from its variable or file, and its absence is secret_missing', (t) => {
  const c = withOidc(valid).api.console.oidc;
  if (c === null) throw new Error('no oidc');
  t.equal(oidcClientSecret(c, { OIDC_SECRET: 's3cret' }), 's3cret');
  t.throws(() => oidcClientSecret(c, {}), { code: 'secret_missing', message: /OIDC_SECRET is not set/ });
  const dir = mkdtempSync(join(tmpdir(), 'al-oidc-secret-'));
  writeFileSync(join(dir, 'secret'), 'from-file\n');
  const { client_secret_env: _, ...fileValid } = valid;
  const fromFile = withOidc({ ...fileValid, client_secret_file: join(dir, 'secret') }).api.console.oidc;
  if (fromFile === null) throw new Error('no oidc');
  t.equal(oidcClientSecret(fromFile, {}), 'from-file', 'trailing newline dropped');
  const missing = withOidc({ ...fileValid, client_secret_file: join(dir, 'absent') }).api.console.oidc;
  if (missing === null) throw new Error('no oidc');
  t.throws(() => oidcClientSecret(missing, {}), { code: 'secret_missing' });
  t.end();
});
