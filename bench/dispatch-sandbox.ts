/**
 * Worker-thread entry for bench/dispatch-env.ts: the sandbox provider and authorizer (real mutual TLS on
 * loopback; with `hang`, a provider that never answers), on their own event loop so the dispatcher's thread does only the client side of each request,
 * as it would against a remote provider. Messages: `stats` -> request and effect counts; `stop` -> servers
 * stopped, then `stopped`.
 */
import { readlinkSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { SandboxAuthorizer, SandboxProvider, type ServerTls } from '../sandbox/index.js';

export interface SandboxThreadData {
  tls: ServerTls;
  token: string;
  /** The provider applies every request and never answers it (a hanging provider), until the thread stops. */
  hang?: boolean;
}

export type SandboxThreadMessage =
  | { type: 'ready'; endpoint: string; authorizeUrl: string; tid: number | null }
  | { type: 'stats'; posts: number; distinctKeys: number; effects: number; authorizations: number }
  | { type: 'stopped' }
  | { type: 'error'; message: string };

async function main(): Promise<void> {
  const port = parentPort;
  if (port === null) throw new Error('dispatch-sandbox.js runs as a worker thread');
  const data = workerData as SandboxThreadData;
  const provider = new SandboxProvider({ tls: data.tls, token: data.token });
  const authorizer = new SandboxAuthorizer({ tls: data.tls });
  if (data.hang === true) provider.inject({ kind: 'timeout', commit: true }, { times: Infinity });
  await provider.start();
  await authorizer.start();
  const send = (m: SandboxThreadMessage): void => port.postMessage(m);
  port.on('message', (m: { type: string }) => {
    if (m.type === 'stats') {
      const posts = provider.requests().filter((r) => r.method === 'POST');
      send({
        type: 'stats',
        posts: posts.length,
        distinctKeys: new Set(posts.map((r) => r.key)).size,
        effects: provider.allEffects().length,
        authorizations: authorizer.requests().length,
      });
    } else if (m.type === 'stop') {
      void Promise.all([provider.stop(), authorizer.stop()]).then(() => send({ type: 'stopped' }));
    }
  });
  send({ type: 'ready', endpoint: provider.endpoint, authorizeUrl: authorizer.authorizeUrl, tid: threadId() });
}

/** This thread's kernel thread id (Linux), so the parent can tell the sandbox's CPU from its own. */
function threadId(): number | null {
  try {
    return Number(readlinkSync('/proc/thread-self').split('/').at(-1));
  } catch {
    return null;
  }
}

main().catch((err: unknown) =>
  parentPort?.postMessage({
    type: 'error',
    message: (err as Error)?.stack ?? String(err),
  } satisfies SandboxThreadMessage),
);
