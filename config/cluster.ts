/**
 * Tenants partitioned across independent PostgreSQL clusters, one fleet per cluster: the configuration maps
 * tenants to the cluster that serves them (`tenant_clusters`), and a deployment names its own (`cluster`, or
 * ACTIONLEDGER_CLUSTER). A reservation or gate call for a tenant mapped to another cluster is refused before
 * anything is written, so a caller routed to the wrong fleet can never split a tenant's ledger in two. A tenant
 * the map does not name is served wherever it arrives.
 */
import type { Config } from './types.js';
import { ActionLedgerError } from '../core/errors.js';

type ClusterConfig = Pick<Config, 'cluster' | 'tenantClusters'>;

/** Why `tenant` may not be served here (its message and details), or null when it may. */
export function tenantClusterRefusal(
  config: ClusterConfig,
  tenant: string,
): { message: string; details: { tenant_id: string; cluster: string; this_cluster: string | null } } | null {
  const home = config.tenantClusters.get(tenant);
  if (home === undefined || home === config.cluster) return null;
  return {
    message: `tenant ${JSON.stringify(tenant)} is served by cluster ${JSON.stringify(home)}, not this one (${JSON.stringify(config.cluster)}): send the call to that cluster's service`,
    details: { tenant_id: tenant, cluster: home, this_cluster: config.cluster },
  };
}

/** Throws `tenant_wrong_cluster` when `tenant` is mapped to a cluster other than this deployment's. */
export function checkTenantCluster(config: ClusterConfig, tenant: string): void {
  const r = tenantClusterRefusal(config, tenant);
  if (r !== null) throw new ActionLedgerError('tenant_wrong_cluster', r.message, { details: r.details });
}
