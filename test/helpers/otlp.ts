/**
 * An OTLP/HTTP trace receiver for tests: a plain node:http server taking `POST /v1/traces` in the JSON encoding
 * (what @opentelemetry/exporter-trace-otlp-http sends), flattening every span with its resource's attributes.
 */
import { createServer, type Server } from 'node:http';

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  attributes: Record<string, unknown>;
  links: { traceId: string; spanId: string }[];
  /** The span's `tracestate` as exported ('' when none). */
  traceState: string;
  resource: Record<string, unknown>;
}

interface OtlpValue {
  stringValue?: string;
  intValue?: string | number;
  boolValue?: boolean;
  doubleValue?: number;
}

interface OtlpAttribute {
  key: string;
  value: OtlpValue;
}

/** OTLP JSON ids are hex; a base64 id (the protobuf mapping's) is turned into hex too. */
function hexId(id: unknown): string {
  if (typeof id !== 'string' || id === '') return '';
  return /^[0-9a-f]+$/.test(id) && (id.length === 32 || id.length === 16)
    ? id
    : Buffer.from(id, 'base64').toString('hex');
}

function attributes(list: OtlpAttribute[] | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const a of list ?? [])
    out[a.key] = a.value.stringValue ?? a.value.intValue ?? a.value.boolValue ?? a.value.doubleValue;
  return out;
}

export class OtlpReceiver {
  readonly spans: ReceivedSpan[] = [];
  /** Every request's path, content type and whether it decoded. */
  readonly requests: { path: string; contentType: string; decoded: boolean }[] = [];
  readonly #server: Server;

  constructor() {
    this.#server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const contentType = req.headers['content-type'] ?? '';
        let decoded = false;
        try {
          this.#take(JSON.parse(Buffer.concat(chunks).toString('utf8')));
          decoded = true;
        } catch {
          // recorded below as not decoded: the test fails on it
        }
        this.requests.push({ path: req.url ?? '', contentType, decoded });
        res.writeHead(decoded ? 200 : 400, { 'content-type': 'application/json' }).end('{}');
      });
    });
  }

  async start(): Promise<number> {
    await new Promise<void>((resolve) => this.#server.listen(0, '127.0.0.1', resolve));
    return (this.#server.address() as { port: number }).port;
  }

  stop(): Promise<void> {
    this.#server.closeAllConnections();
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }

  trace(traceId: string): ReceivedSpan[] {
    return this.spans.filter((s) => s.traceId === traceId);
  }

  #take(body: unknown): void {
    const b = body as {
      resourceSpans?: {
        resource?: { attributes?: OtlpAttribute[] };
        scopeSpans?: {
          spans?: {
            traceId: string;
            spanId: string;
            parentSpanId?: string;
            name: string;
            kind: number;
            attributes?: OtlpAttribute[];
            links?: { traceId: string; spanId: string }[];
            traceState?: string;
          }[];
        }[];
      }[];
    };
    for (const rs of b.resourceSpans ?? []) {
      const resource = attributes(rs.resource?.attributes);
      for (const ss of rs.scopeSpans ?? [])
        for (const s of ss.spans ?? [])
          this.spans.push({
            traceId: hexId(s.traceId),
            spanId: hexId(s.spanId),
            parentSpanId: hexId(s.parentSpanId),
            name: s.name,
            kind: s.kind,
            attributes: attributes(s.attributes),
            links: (s.links ?? []).map((l) => ({ traceId: hexId(l.traceId), spanId: hexId(l.spanId) })),
            traceState: s.traceState ?? '',
            resource,
          });
    }
  }
}
