import { createServer } from 'node:net';

/** A loopback port free a moment ago: for a server the test starts, or, left unused, one nothing answers on. */
export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}
