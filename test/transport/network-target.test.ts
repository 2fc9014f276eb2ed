/**
 * Internal targets (transport/network-target.ts): every address class named, IPv6 forms that carry an IPv4 address
 * judged by it, internal names by their form; and the connect-time check, through the system resolver and a
 * real undici agent against a real HTTPS server on loopback: refused before a connection is opened, while the
 * same agent without the check reaches it.
 */
import { createServer, type Server } from 'node:https';
import type { LookupAddress } from 'node:dns';
import type { LookupFunction } from 'node:net';
import t, { type Test } from 'tap';
import { createMtlsAgent, postJson } from '../../transport/http-client.js';
import {
  PRIVATE_NETWORK_REFUSED,
  addressRefusal,
  guardedLookup,
  hostRefusal,
  privateNetworkRefusal,
} from '../../transport/network-target.js';
import { receiverPki } from '../helpers/notify-receivers.js';

t.test('each address class is named; public addresses pass', (t) => {
  const refused: [string, string][] = [
    ['0.0.0.0', 'unspecified'],
    ['0.1.2.3', 'unspecified'],
    ['::', 'unspecified'],
    ['127.0.0.1', 'loopback'],
    ['127.255.255.254', 'loopback'],
    ['::1', 'loopback'],
    ['10.0.0.1', 'private'],
    ['172.16.0.1', 'private'],
    ['172.31.255.255', 'private'],
    ['192.168.1.1', 'private'],
    ['fc00::1', 'private'],
    ['fd00:ec2::1', 'private'],
    ['fec0::1', 'private'],
    ['169.254.1.1', 'link_local'],
    ['fe80::1', 'link_local'],
    ['fe80::1%eth0', 'link_local'],
    ['100.64.0.1', 'carrier_grade_nat'],
    ['100.100.100.199', 'carrier_grade_nat'],
    ['224.0.0.1', 'multicast'],
    ['239.255.255.250', 'multicast'],
    ['ff02::1', 'multicast'],
    ['255.255.255.255', 'broadcast'],
    ['240.0.0.1', 'reserved'],
    ['192.0.2.1', 'reserved'],
    ['198.18.0.1', 'reserved'],
    ['2001:db8::1', 'reserved'],
    ['2001::1', 'reserved'],
    ['::7f00:1', 'reserved'],
    ['100::1', 'reserved'],
    ['4000::1', 'reserved'],
    // IPv6 forms carrying an IPv4 address are judged by it.
    ['::ffff:127.0.0.1', 'loopback'],
    ['::ffff:7f00:1', 'loopback'],
    ['0:0:0:0:0:ffff:a9fe:101', 'link_local'],
    ['::ffff:0:10.0.0.1', 'private'],
    ['64:ff9b::169.254.169.254', 'metadata'],
    ['2002:7f00:1::1', 'loopback'],
    ['not-an-address', 'reserved'],
  ];
  // Cloud metadata and platform services by their own addresses, before the range they sit in; Azure's
  // WireServer sits in public space and would otherwise pass.
  for (const address of [
    '169.254.169.254',
    '168.63.129.16',
    '100.100.100.200',
    '169.254.170.2',
    '169.254.170.23',
    '169.254.0.23',
    'fd00:ec2::254',
    'fd00:ec2::23',
    '::ffff:168.63.129.16',
    '0:0:0:0:0:ffff:a9fe:a9fe',
    '2002:a83f:8110::1',
  ])
    refused.push([address, 'metadata']);
  for (const [address, cls] of refused) t.equal(addressRefusal(address)?.class, cls, `${address}: ${cls}`);
  t.match(addressRefusal('168.63.129.16')?.message, /a cloud metadata service address \(168\.63\.129\.16\/32\)/);
  t.match(addressRefusal('::ffff:127.0.0.1')?.message, /IPv4-mapped 127\.0\.0\.1, in 127\.0\.0\.0\/8/);
  for (const address of [
    '8.8.8.8',
    '1.1.1.1',
    '168.63.129.17',
    '168.63.129.15',
    '172.32.0.1',
    '100.128.0.1',
    '192.169.0.1',
    '2606:4700:4700::1111',
    '::ffff:8.8.8.8',
    '64:ff9b::808:808',
    '2002:808:808::1',
  ])
    t.equal(addressRefusal(address), null, `${address} is public`);
  t.end();
});

t.test('names: localhost, metadata services, single labels and private suffixes; others wait for resolution', (t) => {
  for (const [host, cls] of [
    ['localhost', 'loopback'],
    ['localhost.', 'loopback'],
    ['a.b.localhost', 'loopback'],
    ['metadata.google.internal', 'metadata'],
    ['metadata.google.internal.', 'metadata'],
    ['metadata', 'metadata'],
    ['instance-data', 'metadata'],
    ['redis', 'internal_name'],
    ['db.corp.internal', 'internal_name'],
    ['svc.cluster.local', 'internal_name'],
    ['localhost.localdomain', 'internal_name'],
    ['box.localdomain', 'internal_name'],
    ['nas.home.arpa', 'internal_name'],
    ['[::1]', 'loopback'],
    ['127.0.0.1', 'loopback'],
  ] as const)
    t.equal(hostRefusal(host)?.class, cls, `${host}: ${cls}`);
  for (const host of ['hooks.example.com', 'slack.com', 'localhost.example.com', 'internal.example.com'])
    t.equal(hostRefusal(host), null, `${host} passes (checked when it resolves)`);
  t.end();
});

/** A resolver answering fixed addresses, in either of `lookup`'s shapes. */
function fixed(addresses: string[]): LookupFunction {
  return (_hostname, options, callback) => {
    const all: LookupAddress[] = addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
    if (options.all === true) callback(null, all);
    else callback(null, all[0]?.address ?? '', all[0]?.family ?? 4);
  };
}

function run(lookup: LookupFunction, all: boolean): Promise<{ err: NodeJS.ErrnoException | null; address: unknown }> {
  return new Promise((resolve) => lookup('hooks.example.com', { all }, (err, address) => resolve({ err, address })));
}

t.test('guardedLookup: any inward address fails the lookup; public answers pass unchanged', async (t) => {
  for (const all of [false, true]) {
    const ok = await run(guardedLookup(fixed(['93.184.215.14', '2606:2800:21f:cb07:6820:80da:af6b:8b2c'])), all);
    t.equal(ok.err, null, `public answers pass (all: ${all})`);
    t.same(
      ok.address,
      all
        ? [
            { address: '93.184.215.14', family: 4 },
            { address: '2606:2800:21f:cb07:6820:80da:af6b:8b2c', family: 6 },
          ]
        : '93.184.215.14',
    );
  }
  const mixed = await run(guardedLookup(fixed(['93.184.215.14', '10.0.0.7'])), true);
  t.equal(mixed.err?.code, PRIVATE_NETWORK_REFUSED, 'one inward address among public ones: refused');
  t.equal(privateNetworkRefusal(mixed.err), 'private');
  t.match(mixed.err?.message, /hooks\.example\.com resolved to 10\.0\.0\.7 is a private address \(10\.0\.0\.0\/8\)/);
  const mapped = await run(guardedLookup(fixed(['::ffff:169.254.169.254'])), false);
  t.equal(privateNetworkRefusal(mapped.err), 'metadata', 'an IPv4-mapped answer is judged by its IPv4 address');
  // A name that resolves to Azure's WireServer (a public address) is refused at the connection too.
  const wire = await run(guardedLookup(fixed(['168.63.129.16'])), false);
  t.equal(privateNetworkRefusal(wire.err), 'metadata', 'Azure WireServer, resolved');
  const failing: LookupFunction = (hostname, _options, callback) =>
    callback(Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' }), '', 4);
  const notFound = await run(guardedLookup(failing), false);
  t.equal(notFound.err?.code, 'ENOTFOUND', "the resolver's own failure is passed on");
  t.equal(privateNetworkRefusal(notFound.err), null);
});

async function listen(t: Test, cert: string, key: string): Promise<{ port: number; connections: () => number }> {
  let connections = 0;
  const server: Server = createServer({ cert, key }, (_req, res) => {
    res.setHeader('content-type', 'application/json');
    res.end('{"ok":true}');
  });
  server.on('connection', () => (connections += 1));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { port: (server.address() as { port: number }).port, connections: () => connections };
}

t.test('through a real agent and the system resolver: localhost is refused before any connection', async (t) => {
  const pki = await receiverPki();
  const server = await listen(t, pki.server.cert, pki.server.key);
  const request = { body: '{}', timeoutMs: 3000, maxBytes: 4096 };
  const guarded = createMtlsAgent({ ca: pki.ca.cert, connectTimeoutMs: 2000, lookup: guardedLookup() });
  const open = createMtlsAgent({ ca: pki.ca.cert, connectTimeoutMs: 2000 });
  t.teardown(() => Promise.all([guarded.close(), open.close()]));

  const refused = await postJson(guarded, `https://localhost:${server.port}/x`, request);
  t.equal(refused.kind, 'not_sent', 'reported as not sent');
  t.equal(refused.kind === 'not_sent' ? privateNetworkRefusal(refused.cause) : null, 'loopback');
  t.equal(server.connections(), 0, 'the server saw no connection');

  const reached = await postJson(open, `https://localhost:${server.port}/x`, request);
  t.equal(reached.kind === 'response' ? reached.status : reached.kind, 200, 'without the check it is reached');
  t.equal(server.connections(), 1);
});
