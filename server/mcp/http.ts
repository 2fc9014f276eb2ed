/**
 * `/mcp`: the MCP server over Streamable HTTP on the API's own fastify instance, behind the same hooks as
 * every `/v1` route: the bearer token is authenticated (and counted in the rate window) before the request
 * reaches the SDK's transport, so a request without a valid token is refused 401 before any MCP message is
 * read, `initialize` and `tools/list` included. The body has already been parsed by the API's strict JSON
 * parser and is handed to the transport as it is; a JSON-RPC batch (an array) counts one request per message
 * in the window, and is refused 429 `rate_limited` as a whole when that takes the window over its limit.
 *
 * Sessions are stateful (the SDK's `mcp-session-id`), because a confirmation asked through the client
 * (elicitation) is a request from the server answered in a later HTTP request of the same session. A session
 * lives in the process that opened it; in a fleet its id names that process, and a request that arrives at
 * another worker is forwarded to it (server/mcp/peers.ts), so the caps below are per process. A session
 * belongs to the tenant and principal that opened it: any other caller naming its id gets exactly what an
 * unknown id gets (404). Idle sessions are closed after {@link IDLE_MS}. A new session makes room by closing
 * least recently used ones, never by refusing: a principal keeps at most {@link MAX_SESSIONS_PER_PRINCIPAL}
 * (its own oldest closes), a tenant at most {@link MAX_SESSIONS_PER_TENANT} (the tenant's oldest closes), and
 * the process at most {@link MAX_SESSIONS} (the oldest of the tenant holding the most closes), so no tenant can
 * lock the others out of the process.
 *
 * Every open response (the session's GET event stream, a POST answered as an event stream) is tied to the
 * credential that opened it: every {@link STREAM_RECHECK_MS} the credentials of the open ones are read again
 * from the database (a token is revoked by another process, the CLI), and the streams of a token or certificate
 * now revoked or expired are ended. A POST's stream ends by itself once its last JSON-RPC result is sent.
 *
 * A JSON-RPC request id is the session's until its answer is sent: a POST carrying a request whose id is still
 * in flight in its session (or one id twice) is refused 409 with a JSON-RPC error before the transport reads
 * it, since the SDK maps answers to streams by id and the first request's stream would never end.
 */
import type { ServerResponse } from 'node:http';
import type { AuthInfo } from '@modelcontextprotocol/sdk/server/auth/types.js';
import type { Server } from '@modelcontextprotocol/sdk/server/index.js';
import type { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { bindQueries } from '../../db/index.js';
import { ActionLedgerError } from '../../core/errors.js';
import type { Authenticated } from '../../principals/index.js';
import { authenticateAgain, callerOf, overWindow } from '../api/auth.js';
import type { ApiDeps } from '../api/types.js';
import { newSessionId } from './peers.js';
import type { Extra } from './server.js';

/** A session unused this long is closed (its client must initialize again). */
export const IDLE_MS = 30 * 60_000;
/** Sessions open at once on one process. */
export const MAX_SESSIONS = 1000;
/**
 * Sessions one principal keeps open on one process: its next `initialize` closes its least recently used
 * session, so a host that never ends its sessions cannot fill the process's {@link MAX_SESSIONS} for others.
 */
export const MAX_SESSIONS_PER_PRINCIPAL = 16;
/**
 * Sessions one tenant keeps open on one process (a quarter of {@link MAX_SESSIONS}): its principals' next
 * `initialize` closes the tenant's least recently used session, so one tenant never holds the whole process.
 */
export const MAX_SESSIONS_PER_TENANT = MAX_SESSIONS / 4;

/**
 * How often the credentials behind open MCP streams are read again: a stream whose token or certificate was
 * revoked or expired is ended within this (plus the look-up).
 */
export const STREAM_RECHECK_MS = 5_000;
/** A stream asked to end that has not closed after this is cut. */
const STREAM_CLOSE_GRACE_MS = 1_000;

interface Session {
  id: string;
  transport: StreamableHTTPServerTransport;
  server: Server;
  tenant: string;
  owner: string;
  lastUsed: number;
  /** The JSON-RPC request ids whose POST is still open (see {@link idKey}). */
  inFlight: Set<string>;
}

/** An open response of a session: who opened it (the credential), and how to end it. */
interface OpenStream {
  credential: string;
  session: Session;
  method: string;
  /** The JSON-RPC request ids a POST carried (its event stream answers them). */
  ids: (string | number)[];
  res: ServerResponse;
}

/** The credentials among `ids` (token ids, or `certificate:<fingerprint>`) that are still active. */
const credentialQueries = {
  active: `
    SELECT token_id::text AS id FROM @schema.api_tokens
    WHERE token_id = ANY($1::uuid[]) AND revoked_at IS NULL AND expires_at > now()
    UNION ALL
    SELECT 'certificate:' || fingerprint_sha256 FROM @schema.principal_certificates
    WHERE fingerprint_sha256 = ANY($2::text[]) AND revoked_at IS NULL AND not_after > now()`,
};

const ownerOf = (c: Authenticated): string => JSON.stringify([c.tenant_id, c.principal_id]);

/**
 * The caller the route authenticated for this very request (set on the raw request as the SDK's `auth`), or,
 * `again`, the same credential authenticated once more now.
 */
function requestCaller(extra: Extra, again = false): Promise<Authenticated> {
  const auth = extra.authInfo?.extra;
  const caller = auth?.caller as Authenticated | undefined;
  const reauthenticate = auth?.again as (() => Promise<Authenticated>) | undefined;
  if (caller === undefined || reauthenticate === undefined)
    return Promise.reject(new ActionLedgerError('unauthenticated', 'no authenticated caller'));
  return again ? reauthenticate() : Promise.resolve(caller);
}

const noSession = () =>
  new ActionLedgerError('not_found', 'no such MCP session: initialize a new one', {
    details: { field: 'mcp-session-id' },
  });

type Loaded = typeof import('./loaded.js');
let loaded: Promise<Loaded> | undefined;
/**
 * The MCP SDK and server, imported by the first session that needs them (loaded.ts says why). A failed import is
 * not kept: the next session tries again.
 */
const loadSdk = (): Promise<Loaded> =>
  (loaded ??= import('./loaded.js').catch((err: unknown) => {
    loaded = undefined;
    throw err;
  }));

/**
 * The caller's session named by `mcp-session-id` (`not_found` when unknown or another's), or a new one for an
 * `initialize` (`opened`); `invalid_request` otherwise.
 */
async function sessionOf(
  deps: ApiDeps,
  sessions: ReturnType<typeof sessionTable>,
  request: FastifyRequest,
  caller: ReturnType<typeof callerOf>,
): Promise<{ session: Session; opened: Session | undefined }> {
  const header = request.headers['mcp-session-id'];
  if (typeof header === 'string') {
    const session = sessions.get(header);
    if (session === undefined || session.owner !== ownerOf(caller)) throw noSession();
    return { session, opened: undefined };
  }
  const mcp = request.method === 'POST' ? await loadSdk() : undefined;
  if (mcp !== undefined && mcp.isInitializeRequest(request.body)) {
    // Room is made and the new session registered with no await between, so parallel initializes each see
    // the others and the caps hold.
    const closing = makeRoom(sessions, caller);
    const session = openSession(deps, sessions, caller, mcp);
    await Promise.all([...closing, session.server.connect(session.transport)]);
    return { session, opened: session };
  }
  throw new ActionLedgerError('invalid_request', 'send mcp-session-id, or initialize a session first', {
    details: { field: 'mcp-session-id' },
  });
}

/**
 * Adds `POST`, `GET` and `DELETE /mcp` to the API (authenticated by its hook like every route). Errors before
 * the transport takes the reply are the API's error bodies: `not_found` (a session that is unknown or not the
 * caller's), `invalid_request` (no session and no `initialize`), `rate_limited` (too many sessions).
 */
export function registerMcpRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const sessions = sessionTable(app);
  const watch = streamWatch(app, deps);

  const handle = async (request: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const caller = callerOf(request);
    await countBatch(deps, request, reply, caller);
    const { session, opened } = await sessionOf(deps, sessions, request, caller);
    session.lastUsed = Date.now();
    const ids = rpcIds(request.body);
    // Checked and taken with no await between, so two POSTs racing with one id cannot both pass.
    if (request.method === 'POST' && !claimIds(session, ids, reply)) return;
    const raw = request.raw as typeof request.raw & { auth?: AuthInfo };
    raw.auth = {
      token: '',
      clientId: caller.principal_id,
      scopes: [...caller.roles],
      extra: { caller, again: () => authenticateAgain(deps, request), request_id: request.id },
    };
    reply.hijack();
    watch({ credential: caller.token_id, session, method: request.method, ids, res: reply.raw });
    try {
      await session.transport.handleRequest(raw, reply.raw, request.body);
    } catch (err) {
      // The reply is the transport's now: fastify's error handler can no longer answer for it.
      deps.log.error({ err, request_id: request.id }, 'MCP request failed');
      if (!reply.raw.headersSent)
        reply.raw
          .writeHead(500, { 'content-type': 'application/json' })
          .end(JSON.stringify({ ok: false, error: 'internal', message: 'internal error' }));
      else reply.raw.end();
    }
    // An initialize the transport refused leaves a session no client knows: it gives its room back.
    if (opened !== undefined && opened.transport.sessionId === undefined) await closeSession(sessions, opened.id);
  };

  const config = { gateAudited: true } as const;
  const tags = ['mcp'] as const;
  app.post(
    '/mcp',
    {
      // The JSON-RPC body has no schema (the MCP transport reads it): its refusals are declared here.
      config: {
        ...config,
        operationId: 'mcpPost',
        errors: ['not_found', 'invalid_json', 'body_too_large', 'unsupported_media_type'],
      },
      schema: {
        summary: 'MCP over Streamable HTTP: a JSON-RPC message (initialize, tools/list, tools/call, ...)',
        description: 'See docs/mcp.md. The answer is JSON or an event stream, as the MCP transport decides.',
        tags,
      },
    },
    handle,
  );
  app.get(
    '/mcp',
    {
      config: { ...config, operationId: 'mcpStream', errors: ['not_found'] },
      schema: { summary: 'MCP: the session’s server-to-client event stream', tags },
    },
    handle,
  );
  app.delete(
    '/mcp',
    {
      config: { ...config, operationId: 'mcpClose', errors: ['not_found'] },
      schema: { summary: 'MCP: end the session', tags },
    },
    handle,
  );
}

/** The process's sessions: one idle for {@link IDLE_MS} is closed, and all of them when the app closes. */
function sessionTable(app: FastifyInstance): Map<string, Session> {
  const sessions = new Map<string, Session>();
  const sweep = setInterval(() => {
    const now = Date.now();
    for (const [id, s] of sessions) if (now - s.lastUsed > IDLE_MS) void closeSession(sessions, id);
  }, 60_000);
  sweep.unref();
  app.addHook('onClose', async () => {
    clearInterval(sweep);
    await Promise.all([...sessions.keys()].map((id) => closeSession(sessions, id)));
  });
  return sessions;
}

/**
 * Keeps the open responses (until each closes) and checks their credentials every {@link STREAM_RECHECK_MS};
 * returns what registers one.
 */
function streamWatch(app: FastifyInstance, deps: ApiDeps): (open: OpenStream) => void {
  const streams = new Set<OpenStream>();
  const check = revokedStreamCheck(deps, streams);
  const recheck = setInterval(() => void check(), STREAM_RECHECK_MS);
  recheck.unref();
  app.addHook('onClose', (_instance, done) => {
    clearInterval(recheck);
    done();
  });
  return (open) => {
    streams.add(open);
    open.res.once('close', () => streams.delete(open));
  };
}

/** The ids of the JSON-RPC requests in a body (one message or a batch). */
function rpcIds(body: unknown): (string | number)[] {
  const ids: (string | number)[] = [];
  for (const m of Array.isArray(body) ? body : [body]) {
    const id = (m as { id?: unknown; method?: unknown } | null)?.id;
    if ((typeof id === 'string' || typeof id === 'number') && typeof (m as { method?: unknown }).method === 'string')
      ids.push(id);
  }
  return ids;
}

/** A request id as the SDK's maps key it: 5 and "5" are two ids. */
const idKey = (id: string | number): string => `${typeof id}:${String(id)}`;

/**
 * Takes the POST's request ids for the session until its response closes; or, when one is already in flight
 * there (or the body names one twice), answers 409 with a JSON-RPC error naming it and takes none.
 */
function claimIds(session: Session, ids: (string | number)[], reply: FastifyReply): boolean {
  const keys = ids.map(idKey);
  const clash = ids.find((_, i) => session.inFlight.has(keys[i] ?? '') || keys.indexOf(keys[i] ?? '') !== i);
  if (clash !== undefined) {
    void reply.code(409).send({
      jsonrpc: '2.0',
      id: clash,
      error: {
        code: -32600,
        message: `request id ${JSON.stringify(clash)} is already in flight in this session: send each request with an id not in use`,
        data: { error: 'invalid_request', problem: 'request_id_in_flight', id: clash },
      },
    });
    return false;
  }
  for (const k of keys) session.inFlight.add(k);
  reply.raw.once('close', () => {
    for (const k of keys) session.inFlight.delete(k);
  });
  return true;
}

/**
 * A check that ends the open streams whose credential is no longer active (revoked or expired): it asks the
 * transport to end each (the GET stream, or the POST's request streams), and cuts the response if it is still
 * open after {@link STREAM_CLOSE_GRACE_MS}. A failed look-up leaves them open until the next one; a check still
 * running when the next is due makes that one a no-op.
 */
function revokedStreamCheck(deps: ApiDeps, streams: Set<OpenStream>): () => Promise<void> {
  const { active } = bindQueries(credentialQueries, deps.config.schemaQuoted);
  let running = false;
  return async () => {
    if (streams.size === 0 || running) return;
    running = true;
    try {
      await endRevokedStreams(deps, streams, active);
    } catch (err) {
      deps.log.warn({ err }, 'MCP streams: the credentials could not be checked; looking again at the next interval');
    } finally {
      running = false;
    }
  };
}

async function endRevokedStreams(deps: ApiDeps, streams: Set<OpenStream>, activeSql: string): Promise<void> {
  const credentials = new Set([...streams].map((s) => s.credential));
  const tokens = [...credentials].filter((c) => !c.startsWith('certificate:'));
  const certificates = [...credentials]
    .filter((c) => c.startsWith('certificate:'))
    .map((c) => c.slice('certificate:'.length));
  const { rows } = await deps.pool.query<{ id: string }>(activeSql, [tokens, certificates]);
  const active = new Set(rows.map((r) => r.id));
  for (const s of streams) {
    if (active.has(s.credential)) continue;
    streams.delete(s);
    deps.log.info(
      { credential: s.credential, method: s.method },
      'MCP stream ended: its credential was revoked or has expired',
    );
    if (s.method === 'GET') s.session.transport.closeStandaloneSSEStream();
    else for (const id of s.ids) s.session.transport.closeSSEStream(id);
    setTimeout(() => {
      if (!s.res.writableFinished) s.res.destroy();
    }, STREAM_CLOSE_GRACE_MS).unref();
  }
}

/**
 * A JSON-RPC batch is as many requests as it has messages: the hook counted one, the rest count here, so a
 * batch cannot carry more tool calls than the window allows. Throws `rate_limited` over the window.
 */
async function countBatch(
  deps: ApiDeps,
  request: FastifyRequest,
  reply: FastifyReply,
  caller: Authenticated,
): Promise<void> {
  if (!Array.isArray(request.body) || request.body.length < 2) return;
  const counted = await deps.principals.countMore(caller, request.body.length - 1);
  const over = overWindow(deps, counted);
  if (over === null) return;
  void reply.header('retry-after', String(counted.window_left_s));
  throw over;
}

/**
 * A new session of the caller, registered at once under the id its transport will announce (so it counts
 * against every cap before any await); connect it to its server before use.
 */
function openSession(deps: ApiDeps, sessions: Map<string, Session>, caller: Authenticated, mcp: Loaded): Session {
  const server = mcp.createMcpServer({ ...deps, caller: requestCaller });
  const id = newSessionId(deps.mcpSessionTag);
  const session: Session = {
    id,
    server,
    tenant: caller.tenant_id,
    owner: ownerOf(caller),
    lastUsed: Date.now(),
    inFlight: new Set(),
    transport: new mcp.StreamableHTTPServerTransport({ sessionIdGenerator: () => id }),
  };
  session.transport.onclose = () => {
    if (sessions.get(id) === session) sessions.delete(id);
  };
  sessions.set(id, session);
  return session;
}

/** The id of the least recently used of `entries`. */
function leastRecent(entries: [string, Session][]): string | undefined {
  if (entries.length === 0) return undefined;
  return entries.reduce((a, b) => (b[1].lastUsed < a[1].lastUsed ? b : a))[0];
}

/**
 * Makes room for one more session of `caller`, synchronously (the closes it starts are returned): the
 * principal's oldest at {@link MAX_SESSIONS_PER_PRINCIPAL}, the tenant's oldest at
 * {@link MAX_SESSIONS_PER_TENANT}, and with the process at {@link MAX_SESSIONS} the oldest of the tenant that
 * holds the most sessions (a tenant within its share is never refused because others filled the process).
 */
function makeRoom(sessions: Map<string, Session>, caller: Authenticated): Promise<void>[] {
  const closing: Promise<void>[] = [];
  const close = (id: string | undefined) => {
    if (id !== undefined) closing.push(closeSession(sessions, id));
  };
  const owner = ownerOf(caller);
  const own = [...sessions].filter(([, s]) => s.owner === owner);
  if (own.length >= MAX_SESSIONS_PER_PRINCIPAL) close(leastRecent(own));
  const tenants = new Map<string, [string, Session][]>();
  for (const entry of sessions) {
    const list = tenants.get(entry[1].tenant);
    if (list === undefined) tenants.set(entry[1].tenant, [entry]);
    else list.push(entry);
  }
  const tenant = (tenants.get(caller.tenant_id) ?? []).filter(([id]) => sessions.has(id));
  if (tenant.length >= MAX_SESSIONS_PER_TENANT) close(leastRecent(tenant));
  if (sessions.size >= MAX_SESSIONS) {
    let busiest: [string, Session][] = [];
    for (const list of tenants.values()) {
      const open = list.filter(([id]) => sessions.has(id));
      if (open.length > busiest.length) busiest = open;
    }
    close(leastRecent(busiest));
  }
  return closing;
}

async function closeSession(sessions: Map<string, Session>, id: string): Promise<void> {
  const s = sessions.get(id);
  sessions.delete(id);
  await s?.server.close().catch(() => undefined);
}
