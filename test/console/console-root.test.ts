/**
 * `/` leads a browser to the console: a redirect that needs no session or token and sets nothing, while every
 * other path keeps the API's answers (a path no route serves is still refused for want of a credential).
 */
import t from 'tap';
import { apiFixture } from '../helpers/api.js';

t.test('/ redirects to /console without a session; the API elsewhere is unchanged', async (t) => {
  const f = await apiFixture(t);
  const open = (path: string, init: RequestInit = {}) => fetch(`${f.base}${path}`, { redirect: 'manual', ...init });

  for (const [what, path, init] of [
    ['GET /', '/', {}],
    ['HEAD /', '/', { method: 'HEAD' }],
    ['a query string', '/?from=bookmark', {}],
    ['an unknown bearer token', '/', { headers: { authorization: 'Bearer alt_nobody' } }],
    ['a stale console cookie', '/', { headers: { cookie: 'al_console=stale' } }],
  ] as const) {
    const res = await open(path, init);
    t.equal(res.status, 302, `${what}: a redirect`);
    t.equal(res.headers.get('location'), '/console', `${what}: to the console`);
    t.equal(res.headers.get('set-cookie'), null, `${what}: sets nothing`);
    await res.arrayBuffer();
  }

  // Where it leads: the console asks a stranger to sign in, with its own security headers.
  const consolePage = await open('/console');
  t.equal(consolePage.status, 401);
  t.match(consolePage.headers.get('content-type'), /^text\/html/);
  t.match(consolePage.headers.get('content-security-policy'), /frame-ancestors 'none'/);
  t.match(await consolePage.text(), /principal login-link PRINCIPAL_ID --break-glass OPERATOR_NAME/);

  // Only GET (and HEAD) of `/` itself: other methods and other paths are the API's, which wants a credential.
  for (const [method, path] of [
    ['POST', '/'],
    ['GET', '/index.html'],
    ['GET', '/v1/status'],
  ] as const) {
    const res = await f.call(method, path);
    t.equal(res.status, 401, `${method} ${path}: still 401`);
    t.equal(res.body.error, 'unauthenticated', `${method} ${path}: the API's error body`);
  }
  const token = await f.token('svc-root', ['operator']);
  t.equal((await f.call('GET', '/v1/status', { token })).status, 200, 'an authenticated API call is unaffected');
  t.equal((await f.call('GET', '/healthz')).status, 200, 'the probes are unaffected');
  t.same(f.undeclared, [], 'no route answered an error it does not declare');
});
