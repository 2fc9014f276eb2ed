/**
 * The Kubernetes manifests (deploy/kubernetes): the base and the example overlay rendered by kustomize (the
 * one inside kubectl; `.ci/run` installs Debian's kubectl where none is found), every object validated offline
 * against its schema (the Kubernetes API's, and the CRDs' of prometheus-operator and KEDA), then the references
 * between them and to the service itself checked: selectors, named ports, probe routes, the commands the
 * containers run, the environment and files the configuration names, the grace period, the egress; and the
 * CloudNativePG cluster (deploy/kubernetes/cloudnative-pg) against the operator's schema and the fleet that uses it.
 */
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import Fastify from 'fastify';
import type { IDeployment } from 'kubernetes-models/apps/v1/Deployment';
import type { ICronJob } from 'kubernetes-models/batch/v1/CronJob';
import type { INetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import type { IPodDisruptionBudget } from 'kubernetes-models/policy/v1/PodDisruptionBudget';
import type { IConfigMap } from 'kubernetes-models/v1/ConfigMap';
import type { IContainer } from 'kubernetes-models/v1/Container';
import type { IPodSpec } from 'kubernetes-models/v1/PodSpec';
import type { ISecret } from 'kubernetes-models/v1/Secret';
import type { IService } from 'kubernetes-models/v1/Service';
import type { IScaledObject } from '@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject';
import type { IServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor';
import { Cluster, type ICluster } from '@kubernetes-models/cloudnative-pg/postgresql.cnpg.io/v1';
import { parseAllDocuments } from 'yaml';
import { COMMANDS } from '../../bin/commands/index.js';
import { parseCommand } from '../../bin/cli-util.js';
import { compileConfig } from '../../config/index.js';
import { Metrics } from '../../core/metrics.js';
import { verifyProfile } from '../../protocol/profile.js';
import { DispatchMetrics } from '../../dispatcher/metrics.js';
import { ReconcileMetrics } from '../../reconciler/metrics.js';
import { STOP_DEADLINE_MS } from '../../reconciler/schedule.js';
import { registerSystemRoutes } from '../../server/api/routes/system.js';

const root = join(import.meta.dirname, '..', '..', '..');
const k8s = join(root, 'deploy', 'kubernetes');
const require = createRequire(import.meta.url);

interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; labels?: Record<string, string> };
  data?: Record<string, string>;
  [field: string]: unknown;
}

/** The parts of config.json these checks read (the rest is checked by compileConfig itself). */
interface RawConfig {
  http: { tls?: { cert_file: string; key_file: string } };
  dispatcher: {
    profile: { path: string; signature_path: string; public_key_path: string };
    tls: Record<string, string>;
  };
  effect_keys?: { keys?: Record<string, { secret_env: string }> };
  tools: Record<
    string,
    { endpoint: string; readback?: { url: string }; effects_listing_url?: string; credential_env?: string }
  >;
}

/** `kubectl kustomize DIR`: the objects, parsed. */
function render(dir: string): K8sObject[] {
  const r = spawnSync('kubectl', ['kustomize', dir], { encoding: 'utf8', maxBuffer: 16 * 1024 * 1024 });
  if (r.error !== undefined)
    throw new Error(`kubectl not found (apt-get install kubernetes-client): ${r.error.message}`);
  if (r.status !== 0) throw new Error(`kubectl kustomize ${dir} failed: ${r.stderr}`);
  const objs = parseAllDocuments(r.stdout)
    .map((d) => d.toJS() as K8sObject | null)
    .filter((o): o is K8sObject => o !== null);
  // Newer kustomize folds a long Secret value over lines; the API server's base64 decoding skips the breaks.
  for (const o of objs)
    if (o.kind === 'Secret' && o.data !== undefined)
      for (const [k, v] of Object.entries(o.data)) o.data[k] = v.replace(/\s+/g, '');
  return objs;
}

type Model = new (data: object) => { validate(): void };

/** Validates an object against its published schema: the model class for its apiVersion and kind. */
function validateObject(o: K8sObject): void {
  const slash = o.apiVersion.indexOf('/');
  const group = slash < 0 ? '' : o.apiVersion.slice(0, slash);
  const version = o.apiVersion.slice(slash + 1);
  const crds: Record<string, string> = {
    'monitoring.coreos.com': '@kubernetes-models/prometheus-operator/monitoring.coreos.com',
    'keda.sh': '@kubernetes-models/keda/keda.sh',
  };
  const path =
    group === '' ? `kubernetes-models/${version}` : `${crds[group] ?? `kubernetes-models/${group}`}/${version}`;
  const Model = (require(path) as Record<string, Model | undefined>)[o.kind];
  if (Model === undefined) throw new Error(`no schema for ${o.apiVersion} ${o.kind}`);
  new Model(o).validate();
}

const matches = (selector: Record<string, string> | undefined, labels: Record<string, string> | undefined): boolean =>
  selector !== undefined &&
  Object.keys(selector).length > 0 &&
  Object.entries(selector).every(([k, v]) => labels?.[k] === v);

function one<T>(objs: K8sObject[], kind: string): T {
  const found = objs.filter((o) => o.kind === kind);
  if (found.length !== 1) throw new Error(`${found.length} objects of kind ${kind}`);
  return found[0] as unknown as T;
}

const deploymentOf = (objs: K8sObject[]) => one<IDeployment>(objs, 'Deployment');
const fleetPod = (objs: K8sObject[]): IPodSpec => deploymentOf(objs).spec!.template.spec!;
const cronPod = (objs: K8sObject[]): IPodSpec => one<ICronJob>(objs, 'CronJob').spec!.jobTemplate.spec!.template.spec!;

async function exposedMetrics(): Promise<Set<string>> {
  const m = new Metrics({ defaultMetrics: false });
  new DispatchMetrics(m.registry);
  new ReconcileMetrics(m.registry);
  return new Set(
    [...(await m.registry.getMetricsAsJSON()), ...(await m.ledgerGauges.getMetricsAsJSON())].map((x) => x.name),
  );
}

const base = render(join(k8s, 'base'));
const overlay = render(join(k8s, 'overlays', 'example'));
const baseConfig = JSON.parse(readFileSync(join(k8s, 'base', 'config.json'), 'utf8')) as RawConfig;

t.test('every rendered object is valid against its schema, and the validation does reject a broken one', (t) => {
  for (const [name, objs] of [
    ['base', base],
    ['overlay', overlay],
  ] as const) {
    t.ok(objs.length >= 9, `${name}: ${objs.length} objects`);
    for (const o of objs) t.doesNotThrow(() => validateObject(o), `${name}: ${o.kind} ${o.metadata.name}`);
  }
  const kinds = new Set(overlay.map((o) => o.kind));
  for (const k of [
    'Deployment',
    'Service',
    'PodDisruptionBudget',
    'CronJob',
    'ConfigMap',
    'Secret',
    'NetworkPolicy',
    'ServiceMonitor',
    'ScaledObject',
  ])
    t.ok(kinds.has(k), `the overlay has a ${k}`);

  // The schemas are not vacuous: a wrong type, a missing required field are each refused.
  /** A copy of the overlay's `kind` with the field at `path` set to `value` (undefined: removed). */
  const broken = (kind: string, path: (string | number)[], value: unknown): K8sObject => {
    const o = structuredClone(overlay.find((x) => x.kind === kind)) as K8sObject;
    let at = o as unknown as Record<string | number, unknown>;
    for (const k of path.slice(0, -1)) at = at[k] as Record<string | number, unknown>;
    const last = path[path.length - 1]!;
    if (value === undefined) delete at[last];
    else at[last] = value;
    return o;
  };
  const pod = ['spec', 'template', 'spec', 'containers', 0];
  t.throws(
    () => validateObject(broken('Deployment', [...pod, 'ports', 0, 'containerPort'], 'http')),
    'a port that is not a number',
  );
  t.throws(
    () => validateObject(broken('CronJob', ['spec', 'jobTemplate', ...pod, 'name'], undefined)),
    'a container without a name',
  );
  t.throws(
    () => validateObject(broken('ScaledObject', ['spec', 'scaleTargetRef'], undefined)),
    'a ScaledObject without its target',
  );
  t.throws(
    () => validateObject(broken('ServiceMonitor', ['spec', 'endpoints'], 'http')),
    'ServiceMonitor endpoints that are not a list',
  );
  t.end();
});

t.test('labels, selectors and named ports agree', (t) => {
  for (const objs of [base, overlay]) {
    const d = deploymentOf(objs);
    const podLabels = d.spec!.template.metadata!.labels;
    t.ok(matches(d.spec!.selector.matchLabels, podLabels), 'the Deployment selects its own pods');
    const svc = one<IService>(objs, 'Service');
    t.ok(matches(svc.spec!.selector, podLabels), 'the Service selects the fleet pods');
    const cronLabels = one<ICronJob>(objs, 'CronJob').spec!.jobTemplate.spec!.template.metadata!.labels;
    t.notOk(matches(svc.spec!.selector, cronLabels), 'and not the CronJob pods');
    const pdb = one<IPodDisruptionBudget>(objs, 'PodDisruptionBudget');
    t.ok(matches(pdb.spec!.selector!.matchLabels, podLabels), 'the PDB covers the fleet');
    const sm = one<IServiceMonitor>(objs, 'ServiceMonitor');
    t.ok(matches(sm.spec.selector.matchLabels, svc.metadata!.labels), 'the ServiceMonitor selects the Service');
    const np = one<INetworkPolicy>(objs, 'NetworkPolicy');
    const npSel = np.spec!.podSelector.matchLabels ?? {};
    for (const labels of [podLabels, cronLabels])
      t.ok(
        Object.entries(npSel).every(([k, v]) => labels?.[k] === v),
        'the NetworkPolicy applies to fleet and CronJob pods',
      );

    const container = fleetPod(objs).containers[0]!;
    const portNames = new Set((container.ports ?? []).map((p) => p.name));
    t.ok(portNames.has('http'));
    for (const p of svc.spec!.ports!) t.ok(portNames.has(String(p.targetPort)), `Service port ${p.name}`);
    const svcPorts = new Set(svc.spec!.ports!.map((p) => p.name));
    for (const e of sm.spec.endpoints ?? []) t.ok(svcPorts.has(e.port), `ServiceMonitor port ${e.port}`);
    for (const probe of [container.readinessProbe, container.livenessProbe, container.startupProbe])
      t.ok(portNames.has(String(probe?.httpGet?.port)), 'a probe on the named port');
    for (const rule of np.spec!.ingress ?? [])
      for (const p of rule.ports ?? []) t.ok(portNames.has(String(p.port)), `NetworkPolicy ingress ${p.port}`);

    const so = one<IScaledObject>(objs, 'ScaledObject');
    t.same(
      [so.spec.scaleTargetRef.kind, so.spec.scaleTargetRef.name],
      ['Deployment', d.metadata!.name],
      'KEDA scales the fleet',
    );
    t.equal(d.spec!.replicas, undefined, 'no replica count in the Deployment: KEDA owns it');
    t.ok((so.spec.minReplicaCount ?? 0) > Number(pdb.spec!.maxUnavailable), 'a drain never takes the last pod');
  }
  t.end();
});

t.test('the probes and the scrape path are routes the service serves, over HTTPS', async (t) => {
  const app = Fastify();
  registerSystemRoutes(app, {} as Parameters<typeof registerSystemRoutes>[1]);
  await app.ready();
  t.teardown(() => app.close());
  const c = fleetPod(overlay).containers[0]!;
  t.equal(c.readinessProbe?.httpGet?.path, '/readyz');
  t.equal(c.livenessProbe?.httpGet?.path, '/healthz');
  const sm = one<IServiceMonitor>(overlay, 'ServiceMonitor');
  const paths = [
    c.readinessProbe?.httpGet?.path,
    c.livenessProbe?.httpGet?.path,
    c.startupProbe?.httpGet?.path,
    ...(sm.spec.endpoints ?? []).map((e) => e.path),
  ];
  for (const url of paths) t.ok(url !== undefined && app.hasRoute({ method: 'GET', url }), `GET ${url} is a route`);
  t.notOk(app.hasRoute({ method: 'GET', url: '/ready' }), 'and a path that is not one is told apart');

  // The API serves HTTPS (config.json's http.tls): the probes and the scrape speak it too.
  t.ok(baseConfig.http.tls, 'the API serves HTTPS');
  for (const probe of [c.readinessProbe, c.livenessProbe, c.startupProbe])
    t.equal(probe?.httpGet?.scheme, 'HTTPS', 'the probe speaks HTTPS');
  for (const e of sm.spec.endpoints ?? []) {
    t.equal(e.scheme, 'https');
    const ca = e.tlsConfig?.ca?.secret;
    const secret = overlay.find((o) => o.kind === 'Secret' && o.metadata.name === ca?.name);
    t.ok(ca !== undefined && secret?.data?.[ca.key], `the scrape checks the certificate against ${ca?.name}`);
  }
});

t.test('the containers run real commands of the image', (t) => {
  const dockerfile = readFileSync(join(root, 'Dockerfile'), 'utf8');
  const entrypoint = JSON.parse(/^ENTRYPOINT (\[.*\])$/m.exec(dockerfile)?.[1] ?? '[]') as string[];
  t.same(entrypoint.slice(-2), ['node', 'dist/bin/actionledger.js'], 'the image runs the CLI: arguments are its');
  t.equal(one<ICronJob>(overlay, 'CronJob').spec!.concurrencyPolicy, 'Forbid');
  const containers = [fleetPod(overlay).containers[0]!, cronPod(overlay).containers[0]!];
  t.same(containers[1]?.args, ['reconcile', '--once', '--json']);
  for (const c of containers) {
    t.equal(c.command, undefined, `${c.name}: the entrypoint is kept`);
    const [name, ...argv] = c.args ?? [];
    const cmd = COMMANDS.get(name ?? '');
    t.ok(cmd, `${name} is a command`);
    if (cmd !== undefined) t.not(typeof parseCommand(cmd, argv), 'number', `${(c.args ?? []).join(' ')} parses`);
    t.match(c.image, /^registry\.example\.internal\/actionledger:\d/, 'the overlay pins the image');
  }
  t.end();
});

t.test('configuration, Secrets and files: everything the configuration names is provided', (t) => {
  const byName = <T>(kind: string) =>
    new Map(overlay.filter((o) => o.kind === kind).map((o) => [o.metadata.name, o as unknown as T]));
  const configMaps = byName<IConfigMap>('ConfigMap');
  const secrets = byName<ISecret>('Secret');

  for (const spec of [fleetPod(overlay), cronPod(overlay)]) {
    const c: IContainer = spec.containers[0]!;
    const volumes = new Map((spec.volumes ?? []).map((v) => [v.name, v]));
    // Every Secret key the pod's environment takes exists in the rendered overlay.
    const env: Record<string, string> = {};
    for (const e of c.env ?? []) {
      const ref = e.valueFrom?.secretKeyRef;
      if (ref !== undefined)
        t.ok(secrets.get(ref.name ?? '')?.data?.[ref.key], `${c.name}: ${e.name} from ${ref.name}/${ref.key}`);
      env[e.name] = ref === undefined ? (e.value ?? '') : 'x'.repeat(48);
    }
    for (const v of volumes.values()) {
      if (v.configMap !== undefined) t.ok(configMaps.has(v.configMap.name ?? ''), `${v.name}: its ConfigMap exists`);
      if (v.secret !== undefined) t.ok(secrets.has(v.secret.secretName ?? ''), `${v.name}: its Secret exists`);
    }
    /** The content of the file at `path` in the container: its volume's source, that source's key. */
    const fileAt = (path: string): string | undefined => {
      for (const m of c.volumeMounts ?? []) {
        const v = volumes.get(m.name);
        const key =
          m.subPath !== undefined
            ? path === m.mountPath
              ? m.subPath
              : undefined
            : path.startsWith(`${m.mountPath}/`)
              ? path.slice(m.mountPath.length + 1)
              : undefined;
        if (key === undefined || v === undefined) continue;
        if (v.configMap !== undefined) return configMaps.get(v.configMap.name ?? '')?.data?.[key];
        const raw = secrets.get(v.secret?.secretName ?? '')?.data?.[key];
        return raw === undefined ? undefined : Buffer.from(raw, 'base64').toString('utf8');
      }
      return undefined;
    };

    const text = fileAt(env.ACTIONLEDGER_CONFIG ?? '');
    t.ok(text, `${c.name}: the configuration file is mounted`);
    const raw = JSON.parse(text ?? '{}') as RawConfig;
    // The configuration compiles with exactly the environment the pod gets: every *_env it names is set.
    t.doesNotThrow(() => compileConfig(raw, env), `${c.name}: the configuration compiles with the pod's environment`);
    const d = raw.dispatcher;
    const files = [d.profile.path, d.profile.signature_path, d.profile.public_key_path, ...Object.values(d.tls)];
    // Only the fleet serves the API; the CronJob's pass never opens its listener.
    if (c.name === 'actionledger') files.push(raw.http.tls?.cert_file ?? '', raw.http.tls?.key_file ?? '');
    for (const p of files) t.ok(fileAt(p) !== undefined, `${c.name}: ${p} is mounted`);
    // The signed profile verifies against the public key beside it, as the dispatcher checks it at start.
    const profile = verifyProfile({
      profileBytes: Buffer.from(fileAt(d.profile.path) ?? ''),
      signature: fileAt(d.profile.signature_path) ?? '',
      publicKeyPem: fileAt(d.profile.public_key_path) ?? '',
    });
    t.equal(profile.profileId, 'example-production');

    // Non-root, read-only root filesystem; every writable path an emptyDir.
    t.equal(spec.securityContext?.runAsNonRoot, true);
    t.equal(c.securityContext?.readOnlyRootFilesystem, true);
    t.equal(c.securityContext?.allowPrivilegeEscalation, false);
    const writable = (c.volumeMounts ?? []).filter((m) => m.readOnly !== true);
    for (const m of writable) t.ok(volumes.get(m.name)?.emptyDir, `${c.name}: ${m.mountPath} is an emptyDir`);
    t.same(writable.map((m) => m.mountPath).sort(), ['/data', '/tmp'], `${c.name}: the data directory and /tmp`);
    t.equal(env.ACTIONLEDGER_DATA_DIR, '/data');
    for (const limits of [c.resources?.requests, c.resources?.limits])
      t.ok(limits?.cpu !== undefined && limits.memory !== undefined, `${c.name}: requests and limits, cpu and memory`);
  }
  t.end();
});

t.test('the grace period outlasts the drain: preStop, the workers’ deadline, the schedule’s stop', (t) => {
  const spec = fleetPod(overlay);
  const preStop = Number(spec.containers[0]?.lifecycle?.preStop?.exec?.command?.[1]);
  t.ok(preStop > 0, 'a preStop pause for the endpoints to drop the pod');
  const configs = [baseConfig, JSON.parse(readFileSync(join(root, 'actionledger.config.json'), 'utf8')) as RawConfig];
  for (const raw of configs) {
    const drainS = compileConfig(raw, secretEnv(raw)).dispatcher.shutdownDeadlineMs / 1000;
    const grace = spec.terminationGracePeriodSeconds ?? 30;
    t.ok(
      grace > preStop + drainS + STOP_DEADLINE_MS / 1000,
      `${grace} s > ${preStop} + ${drainS} + ${STOP_DEADLINE_MS / 1000}`,
    );
  }
  t.end();
});

t.test('KEDA scales on metrics the service exposes; egress goes only where the configuration sends', async (t) => {
  const exposed = await exposedMetrics();
  const so = one<IScaledObject>(overlay, 'ScaledObject');
  const queries = so.spec.triggers.map((tr) => String(tr.metadata.query));
  t.ok(
    queries.some((q) => q.includes('actionledger_outbox_depth')),
    'on depth',
  );
  t.ok(
    queries.some((q) => q.includes('actionledger_outbox_oldest_age_seconds')),
    'and on age',
  );
  for (const q of queries)
    for (const name of q.match(/\bactionledger_[a-z_]+/g) ?? []) t.ok(exposed.has(name), `${name} is exposed`);

  const np = one<INetworkPolicy>(overlay, 'NetworkPolicy');
  t.same(np.spec!.policyTypes, ['Ingress', 'Egress']);
  const egressPorts = (np.spec!.egress ?? []).flatMap((r) => (r.ports ?? []).map((p) => Number(p.port)));
  t.same(
    [...new Set(egressPorts)].sort((a, b) => a - b),
    [53, 443, 5432],
    'DNS, HTTPS, PostgreSQL: nothing else',
  );
  const profile = JSON.parse(readFileSync(join(k8s, 'overlays', 'example', 'profile', 'profile.json'), 'utf8')) as {
    authorization_url: string;
  };
  const urls = [
    profile.authorization_url,
    ...Object.values(baseConfig.tools).flatMap((tool) => [tool.endpoint, tool.readback?.url, tool.effects_listing_url]),
  ].filter((u): u is string => u !== undefined);
  for (const u of urls) {
    const url = new URL(u.replace(/\{[a-z_]+\}/g, 'x'));
    t.ok(egressPorts.includes(Number(url.port || 443)), `${url.host}: its port is open for egress`);
  }
});

/** Placeholder values for everything a configuration names by environment variable. */
function secretEnv(raw: RawConfig): Record<string, string> {
  const env: Record<string, string> = { DATABASE_URL: 'postgres://localhost/x' };
  for (const k of Object.values(raw.effect_keys?.keys ?? {})) env[k.secret_env] = 'x'.repeat(48);
  env.ACTIONLEDGER_EFFECT_KEY_SECRET ??= 'x'.repeat(48);
  for (const tool of Object.values(raw.tools)) if (tool.credential_env !== undefined) env[tool.credential_env] = 'x';
  return env;
}

t.test('the CloudNativePG cluster: reachable by the fleet, replicated synchronously, enough connections', (t) => {
  const objs = render(join(k8s, 'cloudnative-pg'));
  const cluster = one<ICluster & { metadata: { name: string } }>(objs, 'Cluster');
  t.equal(objs[0]?.apiVersion, 'postgresql.cnpg.io/v1');
  // The operator's own schema for the Cluster resource: CloudNativePG 1.24's (@kubernetes-models/cloudnative-pg
  // 0.1, the last release that runs on Node 20), which predates synchronous.dataDurability (1.25); checked below.
  t.doesNotThrow(() => new Cluster(cluster).validate(), 'valid against the CloudNativePG Cluster schema');
  t.throws(
    () => new Cluster({ ...cluster, spec: { ...cluster.spec, instances: 'three' } } as unknown as ICluster).validate(),
    /instances must be integer/,
    'and the schema refuses a wrong type',
  );
  t.equal(
    cluster.metadata.namespace,
    overlay.find((o) => o.kind === 'Namespace')?.metadata.name,
    'the fleet’s namespace',
  );
  // The NetworkPolicy lets the fleet reach exactly this cluster's pods, and the database URL names its -rw Service.
  const np = one<INetworkPolicy>(overlay, 'NetworkPolicy');
  const pgRule = (np.spec!.egress ?? []).find((r) => (r.ports ?? []).some((p) => Number(p.port) === 5432));
  t.equal(pgRule?.to?.[0]?.podSelector?.matchLabels?.['cnpg.io/cluster'], cluster.metadata.name);
  const dbSecret = overlay.find((o) => o.kind === 'Secret' && o.metadata.name.startsWith('actionledger-database'));
  const url = new URL(Buffer.from(dbSecret?.data?.url ?? '', 'base64').toString('utf8'));
  t.equal(url.hostname, `${cluster.metadata.name}-rw`, 'the URL names the primary’s Service');
  // A commit waits for a standby: a failover to it loses no acknowledged write.
  const sync = cluster.spec?.postgresql?.synchronous;
  t.ok(
    sync !== undefined && sync.number >= 1 && (cluster.spec?.instances ?? 0) >= sync.number + 1,
    'synchronous standbys',
  );
  t.equal((sync as { dataDurability?: string } | undefined)?.dataDurability, 'required');
  // Connections: every fleet pod at KEDA's maximum (its pool, pg-boss's 3, each worker's pool and claim
  // connection) and a CronJob pass.
  const raw = baseConfig as RawConfig & {
    database?: { pool_max?: number };
    dispatcher: { workers?: number; concurrency?: number };
  };
  const poolMax = raw.database?.pool_max ?? 10;
  const perWorker = Math.max(poolMax, (raw.dispatcher.concurrency ?? 16) + 4) + 1;
  const perPod = poolMax + 3 + (raw.dispatcher.workers ?? 2) * perWorker;
  const maxPods = one<IScaledObject>(overlay, 'ScaledObject').spec.maxReplicaCount ?? 100;
  const needed = maxPods * perPod + poolMax + 3;
  const max = Number(cluster.spec?.postgresql?.parameters?.max_connections);
  t.ok(max >= needed + 10, `max_connections ${max} >= ${needed} + superuser reserve`);
  t.end();
});
