/**
 * The one mapping of fastify's own errors to codes (server/api/framework-errors.ts), used by the API's error
 * handler and by the console's error page: each of fastify's errors it knows, a schema violation, other client
 * errors by their status, and what is not a client error. Then through both surfaces on one app: the same
 * too-large body and the same unparsed media type answer the same code from a /v1 route and a console form.
 */
import t from 'tap';
import { errorCodes, type FastifyError } from 'fastify';
import { ActionLedgerError } from '../../core/errors.js';
import { FORM_BODY, JSON_BODY, frameworkError } from '../../server/api/framework-errors.js';
import { apiFixture } from '../helpers/api.js';

const coded = (err: Error, body = JSON_BODY) => {
  const e = frameworkError(err, body);
  return { code: e.code, message: e.message, details: e.details };
};

t.test("fastify's known errors", (t) => {
  const cases: [string, Error, string, RegExp][] = [
    ['a body over the cap', new errorCodes.FST_ERR_CTP_BODY_TOO_LARGE(), 'body_too_large', /the body is over the cap/],
    [
      'a media type nobody parses',
      new errorCodes.FST_ERR_CTP_INVALID_MEDIA_TYPE(),
      'unsupported_media_type',
      /send the body as application\/json/,
    ],
    [
      'a content-length the body does not match',
      new errorCodes.FST_ERR_CTP_INVALID_CONTENT_LENGTH(),
      'invalid_request',
      /content-length/,
    ],
    ['an empty JSON body', new errorCodes.FST_ERR_CTP_EMPTY_JSON_BODY(), 'invalid_json', /empty/],
    ['a JSON body that is not JSON', new errorCodes.FST_ERR_CTP_INVALID_JSON_BODY(), 'invalid_json', /not JSON/],
    ['a path the router cannot decode', new errorCodes.FST_ERR_BAD_URL('%zz'), 'invalid_request', /path/],
  ];
  for (const [what, err, code, message] of cases) {
    const r = coded(err);
    t.equal(r.code, code, `${what}: ${code}`);
    t.match(r.message, message, `${what}: says why`);
  }
  t.end();
});

t.test('the console speaks of a form, with the same codes', (t) => {
  t.same(coded(new errorCodes.FST_ERR_CTP_BODY_TOO_LARGE(), FORM_BODY), {
    code: 'body_too_large',
    message: 'the form is over the cap',
    details: undefined,
  });
  t.same(coded(new errorCodes.FST_ERR_CTP_INVALID_MEDIA_TYPE(), FORM_BODY), {
    code: 'unsupported_media_type',
    message: 'send the form as application/x-www-form-urlencoded',
    details: undefined,
  });
  t.end();
});

t.test('a schema violation names the field and the keyword', (t) => {
  const err = Object.assign(new Error('body/role must be string'), {
    validation: [
      {
        keyword: 'additionalProperties',
        instancePath: '/user',
        params: { additionalProperty: 'x' },
        message: 'must NOT have additional properties',
      },
    ],
    validationContext: 'body',
  }) as unknown as FastifyError;
  t.same(coded(err), {
    code: 'invalid_request',
    message: 'body.user.x must NOT have additional properties',
    details: { field: 'body.user.x', problem: 'additionalProperties' },
  });
  const missing = Object.assign(new Error('x'), {
    validation: [{ keyword: 'required', instancePath: '', params: { missingProperty: 'id' }, message: 'is required' }],
    validationContext: 'querystring',
  }) as unknown as FastifyError;
  t.same(coded(missing).details, { field: 'querystring.id', problem: 'required' });
  t.end();
});

t.test('other errors: by status, as they are, or internal', (t) => {
  const withStatus = (statusCode: number) => Object.assign(new Error('framework text'), { statusCode });
  t.equal(coded(withStatus(413)).code, 'body_too_large');
  t.equal(coded(withStatus(415)).code, 'unsupported_media_type');
  t.same(coded(withStatus(431)), { code: 'invalid_request', message: 'the request is malformed', details: undefined });
  t.equal(coded(withStatus(500)).code, 'internal');
  const own = new ActionLedgerError('rate_limited', 'slow down', { details: { retry_after_s: 3 } });
  t.equal(frameworkError(own), own, 'a coded error is kept as it is');
  const pg = Object.assign(new Error('could not extend file'), { code: '53100' });
  t.equal(coded(pg).code, 'storage_full', 'a database failure by its SQLSTATE');
  t.same(coded(new Error('a secret detail')), { code: 'internal', message: 'internal error', details: undefined });
  t.end();
});

t.test('the API and the console answer the same codes for the same framework errors', async (t) => {
  const f = await apiFixture(t, { api: { max_body_bytes: 1024 } });
  const token = await f.token('svc', ['service']);
  const big = 'x'.repeat(70_000);
  const api = await f.call('POST', '/v1/calls', {
    token,
    raw: `{"tool":"${big}"}`,
    headers: { 'content-type': 'application/json' },
  });
  const consoleForm = await f.call('POST', '/console/login', {
    raw: `link=${big}`,
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
  });
  t.same([api.status, api.body.error], [413, 'body_too_large'], 'the API: 413 body_too_large');
  t.equal(consoleForm.status, 413, 'the console: 413');
  t.match(consoleForm.text, /body_too_large/, 'the console page names the same code');
  const apiType = await f.call('POST', '/v1/calls', { token, raw: 'a=1', headers: { 'content-type': 'text/plain' } });
  const consoleType = await f.call('POST', '/console/login', {
    raw: 'a=1',
    headers: { 'content-type': 'text/plain' },
  });
  t.same([apiType.status, apiType.body.error], [415, 'unsupported_media_type']);
  t.equal(consoleType.status, 415);
  t.match(consoleType.text, /unsupported_media_type/);
});
