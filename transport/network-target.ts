/**
 * Where an outgoing request may go. Notification destinations are written by operators but point at receivers
 * outside: a URL naming this host, the private network, or a cloud metadata service would turn the notifier
 * into a way in (server-side request forgery). This module classifies a target twice:
 *
 * - at configuration load, by the URL's host as Node's URL parser normalizes it (`https://2130706433/`,
 *   `https://0x7f.1/` and `https://127.1/` are all `127.0.0.1`; `[::ffff:127.0.0.1]` is `[::ffff:7f00:1]`),
 *   an IP literal by its address and a name by its form (`localhost`, `*.internal`, a single label...);
 * - at connect time, through {@link guardedLookup}: the socket's own DNS lookup checks every address the name
 *   resolved to, so the address refused is the one that would have been connected to (no second resolution a
 *   rebinding name could answer differently).
 *
 * The address rules are node:net `BlockList`s, one per range, so a refusal names the range it fell in. The cloud
 * metadata services' own addresses are classed `metadata` before the range they sit in, and so is one that sits
 * in public space: Azure's WireServer, 168.63.129.16, which every Azure VM reaches and which serves its
 * configuration and extensions, would otherwise pass as a public address. An IPv6
 * address that carries an IPv4 one (IPv4-mapped `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96`, NAT64
 * `64:ff9b::/96`, 6to4 `2002::/16`) is judged by the IPv4 address inside; outside global unicast `2000::/3`
 * every IPv6 address is refused.
 */
import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { BlockList, isIP, isIPv4, type LookupFunction } from 'node:net';

export type TargetClass =
  | 'unspecified'
  | 'loopback'
  | 'private'
  | 'link_local'
  | 'carrier_grade_nat'
  | 'multicast'
  | 'broadcast'
  | 'reserved'
  | 'metadata'
  | 'internal_name';

/** A refused target: its class (stable, for logs and delivery records) and a sentence naming it. */
export interface TargetRefusal {
  readonly class: TargetClass;
  /** E.g. `127.0.0.1 is a loopback address (127.0.0.0/8)`. */
  readonly message: string;
}

const CLASS_WORDS: Record<TargetClass, string> = {
  unspecified: 'an unspecified address',
  loopback: 'a loopback address',
  private: 'a private address',
  link_local: 'a link-local address',
  carrier_grade_nat: 'a carrier-grade NAT address',
  multicast: 'a multicast address',
  broadcast: 'the broadcast address',
  reserved: 'a reserved address',
  metadata: 'a cloud metadata service address',
  internal_name: 'an internal name',
};

interface Rule {
  readonly class: TargetClass;
  readonly range: string;
  readonly list: BlockList;
}

function rules(family: 'ipv4' | 'ipv6', spec: readonly (readonly [TargetClass, string])[]): readonly Rule[] {
  return spec.map(([cls, range]) => {
    const [net, prefix] = range.split('/') as [string, string];
    const list = new BlockList();
    list.addSubnet(net, Number(prefix), family);
    return { class: cls, range, list };
  });
}

/** In the order checked: the first range that holds the address names its class. */
const IPV4 = rules('ipv4', [
  // Cloud metadata and platform services, before the ranges they sit in (one sits in public space).
  ['metadata', '169.254.169.254/32'], // instance metadata of AWS, Azure, Google Cloud, Oracle Cloud, OpenStack, ...
  ['metadata', '168.63.129.16/32'], // Azure WireServer (VM agent configuration, extensions; a public address)
  ['metadata', '100.100.100.200/32'], // Alibaba Cloud instance metadata
  ['metadata', '169.254.170.2/32'], // Amazon ECS task metadata and credentials endpoint
  ['metadata', '169.254.170.23/32'], // Amazon EKS Pod Identity agent (credentials)
  ['metadata', '169.254.0.23/32'], // Tencent Cloud instance metadata (metadata.tencentyun.com)
  ['unspecified', '0.0.0.0/8'], // "this network": 0.0.0.0 reaches this host on Linux
  ['loopback', '127.0.0.0/8'],
  ['private', '10.0.0.0/8'],
  ['private', '172.16.0.0/12'],
  ['private', '192.168.0.0/16'],
  ['link_local', '169.254.0.0/16'], // cloud metadata (169.254.169.254) lives here
  ['carrier_grade_nat', '100.64.0.0/10'], // RFC 6598 shared address space (also Alibaba Cloud's metadata)
  ['multicast', '224.0.0.0/4'],
  ['broadcast', '255.255.255.255/32'],
  ['reserved', '240.0.0.0/4'],
  ['reserved', '192.0.0.0/24'], // IETF protocol assignments
  ['reserved', '192.0.2.0/24'], // documentation
  ['reserved', '198.51.100.0/24'], // documentation
  ['reserved', '203.0.113.0/24'], // documentation
  ['reserved', '198.18.0.0/15'], // benchmarking
  ['reserved', '192.88.99.0/24'], // former 6to4 relay anycast
]);

const IPV6 = rules('ipv6', [
  ['metadata', 'fd00:ec2::254/128'], // AWS instance metadata over IPv6 (Nitro instances)
  ['metadata', 'fd00:ec2::23/128'], // Amazon EKS Pod Identity agent over IPv6
  ['unspecified', '::/128'],
  ['loopback', '::1/128'],
  ['reserved', '::/96'], // deprecated IPv4-compatible addresses (::a.b.c.d)
  ['private', 'fc00::/7'], // unique local addresses
  ['private', 'fec0::/10'], // deprecated site-local addresses
  ['link_local', 'fe80::/10'],
  ['multicast', 'ff00::/8'],
  ['reserved', '100::/64'], // discard-only
  ['reserved', '2001::/23'], // IETF protocol assignments (Teredo among them)
  ['reserved', '2001:db8::/32'], // documentation
  ['reserved', '3fff::/20'], // documentation
]);

/** Global unicast: an IPv6 address outside it (and not one carrying an IPv4 address) is refused. */
const GLOBAL_UNICAST = rules('ipv6', [['reserved', '2000::/3']])[0] as Rule;

/** The eight 16-bit groups of a valid IPv6 address (no zone). */
function ipv6Groups(address: string): number[] {
  let s = address;
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s);
  if (dotted !== null) {
    const [a, b, c, d] = dotted.slice(1).map(Number) as [number, number, number, number];
    s = `${s.slice(0, dotted.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', tail] = s.split('::');
  const h = head === '' ? [] : head.split(':');
  const t = tail === undefined || tail === '' ? [] : tail.split(':');
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  return groups.map((g) => parseInt(g, 16));
}

const ipv4Of = (hi: number, lo: number): string => `${hi >> 8}.${hi & 0xff}.${lo >> 8}.${lo & 0xff}`;

/** The IPv4 address an IPv6 one carries, with the form's name; null for none. */
function embeddedIpv4(g: readonly number[]): { ipv4: string; form: string } | null {
  const [g0, g1, g2, g3, g4, g5, g6 = 0, g7 = 0] = g;
  const zeroTo = (n: number): boolean => g.slice(0, n).every((x) => x === 0);
  if (zeroTo(5) && g5 === 0xffff) return { ipv4: ipv4Of(g6, g7), form: 'IPv4-mapped' };
  if (zeroTo(4) && g4 === 0xffff && g5 === 0) return { ipv4: ipv4Of(g6, g7), form: 'IPv4-translated' };
  if (g0 === 0x64 && g1 === 0xff9b && g2 === 0 && g3 === 0 && g4 === 0 && g5 === 0)
    return { ipv4: ipv4Of(g6, g7), form: 'NAT64' };
  if (g0 === 0x2002 && g1 !== undefined && g2 !== undefined) return { ipv4: ipv4Of(g1, g2), form: '6to4' };
  return null;
}

function matchIpv4(address: string): Rule | undefined {
  return IPV4.find((r) => r.list.check(address, 'ipv4'));
}

/**
 * Why an IP address may not be connected to, or null when it is a public one. Takes any form `isIP` accepts
 * (an IPv6 zone `%eth0` is ignored); anything else is refused as `reserved`.
 */
export function addressRefusal(address: string): TargetRefusal | null {
  const bare = address.replace(/%.*$/, '');
  const refused = (cls: TargetClass, detail: string): TargetRefusal => ({
    class: cls,
    message: `${address} is ${CLASS_WORDS[cls]} (${detail})`,
  });
  if (isIPv4(bare)) {
    const r = matchIpv4(bare);
    return r === undefined ? null : refused(r.class, r.range);
  }
  if (isIP(bare) !== 6) return { class: 'reserved', message: `${address} is not an IP address` };
  const inner = embeddedIpv4(ipv6Groups(bare));
  if (inner !== null) {
    const r = matchIpv4(inner.ipv4);
    return r === undefined ? null : refused(r.class, `${inner.form} ${inner.ipv4}, in ${r.range}`);
  }
  const r = IPV6.find((x) => x.list.check(bare, 'ipv6'));
  if (r !== undefined) return refused(r.class, r.range);
  if (!GLOBAL_UNICAST.list.check(bare, 'ipv6')) return refused('reserved', 'outside global unicast 2000::/3');
  return null;
}

/** How a refused name is described where its class's words speak of addresses. */
const NAME_WORDS: Partial<Record<TargetClass, string>> = {
  loopback: 'a loopback name',
  metadata: 'a cloud metadata service name',
};

/** Cloud metadata services' names (their addresses are refused as `metadata` too). */
const METADATA_NAMES = new Set(['metadata.google.internal', 'metadata', 'instance-data', 'instance-data.ec2.internal']);
/** Suffixes of names that only mean something inside a network: RFC 6761, RFC 6762, RFC 8375, ICANN's .internal. */
const INTERNAL_SUFFIXES = ['.internal', '.local', '.localdomain', '.home.arpa'];

/**
 * Why a URL host (`url.hostname`: already lower-case and, for an IP, normalized; IPv6 in brackets) may not be
 * a destination, or null. An IP literal is judged by {@link addressRefusal}. A name is refused when it is
 * `localhost` or under `.localhost` (loopback), a cloud metadata service's name, a single label (resolved
 * through the local search domains, as a cluster's service names are), or under `.internal`, `.local`,
 * `.localdomain` or `.home.arpa`; a trailing dot changes nothing. Any other name is checked when it resolves.
 */
export function hostRefusal(hostname: string): TargetRefusal | null {
  const literal = hostname.startsWith('[') && hostname.endsWith(']') ? hostname.slice(1, -1) : hostname;
  if (isIP(literal) !== 0) return addressRefusal(literal);
  const name = hostname.toLowerCase().replace(/\.+$/, '');
  const refused = (cls: TargetClass, detail: string): TargetRefusal => ({
    class: cls,
    message: `${hostname} is ${NAME_WORDS[cls] ?? CLASS_WORDS[cls]} (${detail})`,
  });
  if (name === 'localhost' || name.endsWith('.localhost')) return refused('loopback', 'localhost and *.localhost');
  if (METADATA_NAMES.has(name)) return refused('metadata', 'an instance metadata endpoint');
  if (name === '') return refused('internal_name', 'empty');
  if (!name.includes('.')) return refused('internal_name', 'a single label, resolved through local search domains');
  const suffix = INTERNAL_SUFFIXES.find((s) => name.endsWith(s));
  if (suffix !== undefined) return refused('internal_name', `under ${suffix}, meaningful only inside a network`);
  return null;
}

/** The authority of an `https://` URL as written (before the URL parser drops or rewrites anything). */
function authorityOf(raw: string): string {
  const rest = raw.replace(/^[a-z][a-z0-9+.-]*:\/\//i, '');
  const end = rest.search(/[/?#\\]/);
  return end === -1 ? rest : rest.slice(0, end);
}

/**
 * Checks a destination URL at configuration load: null when it may be used, else a message for the problem
 * (the caller adds its JSON pointer). Userinfo (`user:pass@`) is refused whatever `allowPrivateNetwork` says:
 * it would be a credential written in the file, and it is never sent (requests go to the URL's origin). An
 * internal target (see {@link hostRefusal}) is refused unless `allowPrivateNetwork`.
 */
export function destinationUrlProblem(
  raw: string,
  allowPrivateNetwork: boolean,
): { message: string; class: TargetClass | 'userinfo' | 'invalid' } | null {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return { class: 'invalid', message: 'is not a URL' };
  }
  if (url.username !== '' || url.password !== '' || authorityOf(raw).includes('@'))
    return {
      class: 'userinfo',
      message:
        'contains userinfo (a name or password before @): a credential does not belong in the configuration, ' +
        'and it would not be sent; refused even with allow_private_network',
    };
  if (allowPrivateNetwork) return null;
  const r = hostRefusal(url.hostname);
  if (r === null) return null;
  return {
    class: r.class,
    message: `${r.message}: internal targets are refused unless the destination sets allow_private_network: true`,
  };
}

/** The `code` of the error a {@link guardedLookup} refusal fails the connection with. */
export const PRIVATE_NETWORK_REFUSED = 'ERR_PRIVATE_NETWORK_REFUSED';

export interface PrivateNetworkError extends Error {
  readonly code: typeof PRIVATE_NETWORK_REFUSED;
  readonly hostname: string;
  readonly address: string;
  readonly addressClass: TargetClass;
}

/** The refused class when `err` is a {@link guardedLookup} refusal, else null. */
export function privateNetworkRefusal(err: unknown): TargetClass | null {
  const e = err as Partial<PrivateNetworkError> | null;
  return e !== null && typeof e === 'object' && e.code === PRIVATE_NETWORK_REFUSED && e.addressClass !== undefined
    ? e.addressClass
    : null;
}

/**
 * A `lookup` for `net.connect` / `tls.connect` (undici's connector passes it on) that resolves with `resolve`
 * (default: `dns.lookup`, the system resolver) and fails the connection when any address the name resolved to
 * is refused by {@link addressRefusal}: a name with one address inward is not trusted with its others. The
 * socket connects only to addresses this function returned, so the check is on what is connected to. Node
 * skips `lookup` for an IP literal host: literals are checked at configuration load.
 */
export function guardedLookup(resolve: LookupFunction = dnsLookup): LookupFunction {
  return (hostname, options, callback) => {
    resolve(hostname, options, (err, address, family) => {
      if (err !== null) return callback(err, address, family);
      const all: readonly LookupAddress[] = Array.isArray(address)
        ? address
        : [{ address, family: family ?? isIP(address) }];
      for (const a of all) {
        const r = addressRefusal(a.address);
        if (r === null) continue;
        const detail: Omit<PrivateNetworkError, keyof Error> = {
          code: PRIVATE_NETWORK_REFUSED,
          hostname,
          address: a.address,
          addressClass: r.class,
        };
        const refusal: PrivateNetworkError = Object.assign(
          new Error(`${hostname} resolved to ${r.message}: refused (allow_private_network is not set)`),
          detail,
        );
        return callback(refusal, Array.isArray(address) ? [] : '', family);
      }
      callback(null, address, family);
    });
  };
}
