// Offline checks of rendered manifests (the output of `kubectl kustomize`), without a cluster:
//
//   node deploy/checks/validate.mjs NAME=FILE.yaml[,FILE2.yaml] ...
//
// Each NAME is one set of objects applied together (an overlay, plus e.g. the example trainer
// Job); the cross-object checks look inside one set. For every object:
//   1. schema   the kubernetes-models class of its apiVersion/kind validates it (types, required
//               fields, enums); CRDs through @kubernetes-models/keda and /prometheus-operator.
//               A kind with no model is an error.
//   2. fields   no unknown field: built-in kinds walk @kubernetes/client-node's attribute type
//               maps (what the API server's strict field validation knows), CRDs walk the
//               property lists of their kubernetes-models type declarations.
//   3. set      selectors match pod template labels (Deployment/StatefulSet/Job, Service, PDB,
//               NetworkPolicy, ServiceMonitor -> Service, PodMonitor -> pods), named ports
//               exist (Service targetPort, probes, NetworkPolicy, monitors), referenced
//               ConfigMaps/PVCs/ServiceAccounts/scale targets exist, pods run non-root with
//               seccomp RuntimeDefault, a read-only root, no privilege escalation, requests and
//               limits, the app.kubernetes.io/ labels, and workers' grace period exceeds their
//               drain timeout; a StatefulSet's serviceName is a headless Service; a Deployment
//               that a ScaledObject or HPA scales sets no replicas; priority classes exist;
//               secret volumes name a Certificate's secret or a Secret the docs tell you to make.
// Prints one line per problem and exits 1 if there is any.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

const require = createRequire(import.meta.url);
const here = path.dirname(fileURLToPath(import.meta.url));

// ---- 1. schema ---------------------------------------------------------------------------------

const CRD_PACKAGES = {
  "keda.sh": "@kubernetes-models/keda",
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
  "cert-manager.io": "@kubernetes-models/cert-manager",
};

function modelPath(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (CRD_PACKAGES[group]) return `${CRD_PACKAGES[group]}/${group}/${version}/${kind}`;
  return group ? `kubernetes-models/${group}/${version}/${kind}` : `kubernetes-models/${version}/${kind}`;
}

async function schemaErrors(obj) {
  let mod;
  try {
    mod = await import(modelPath(obj.apiVersion, obj.kind));
  } catch {
    return [`no schema for ${obj.apiVersion} ${obj.kind} (add its kubernetes-models package)`];
  }
  try {
    new mod[obj.kind](obj).validate();
    return [];
  } catch (e) {
    const details = (e.errors || []).map((x) => `${x.instancePath || "/"} ${x.message}`);
    return details.length ? details : [String(e.message || e)];
  }
}

// ---- 2. unknown fields -------------------------------------------------------------------------

// Built-in kinds: @kubernetes/client-node's generated models list every field with its type.
const clientModels = path.join(path.dirname(require.resolve("@kubernetes/client-node/package.json")),
  "dist", "gen", "models");
const typeMaps = new Map();
function clientTypeMap(type) {
  if (!typeMaps.has(type)) {
    const file = path.join(clientModels, `${type}.js`);
    typeMaps.set(type, fs.existsSync(file) ? require(file)[type]?.getAttributeTypeMap?.() ?? null : null);
  }
  return typeMaps.get(type);
}
function clientType(apiVersion, kind) {
  const version = apiVersion.split("/").pop();
  const name = version.charAt(0).toUpperCase() + version.slice(1) + kind;
  return clientTypeMap(name) ? name : null;
}
function unknownByClientModel(value, type, where, out) {
  if (value === null || value === undefined) return;
  const array = /^Array<(.+)>$/.exec(type);
  if (array) {
    if (Array.isArray(value)) value.forEach((v, i) => unknownByClientModel(v, array[1], `${where}[${i}]`, out));
    return;
  }
  const map = clientTypeMap(type);
  if (!map || typeof value !== "object" || Array.isArray(value)) return;  // leaf, map or any
  const fields = new Map(map.map((a) => [a.baseName, a.type]));
  for (const [key, v] of Object.entries(value)) {
    if (!fields.has(key)) out.push(`${where}.${key}: unknown field (${type} has no such field)`);
    else unknownByClientModel(v, fields.get(key), `${where}.${key}`, out);
  }
}

// CRDs: the TypeScript declarations of their kubernetes-models classes list each interface's
// properties and their types ("name"?: IOther | Array<IOther> | string | {...}).
const declarations = new Map();
function declaration(file) {
  if (declarations.has(file)) return declarations.get(file);
  const text = fs.readFileSync(file, "utf8");
  const imports = new Map();
  for (const m of text.matchAll(/import \{ (\w+) \} from "([^"]+)";/g)) imports.set(m[1], m[2]);
  const iface = /export interface (\w+)(?: extends ([\w, ]+))? \{\n([\s\S]*?)\n\}/.exec(text);
  let decl = null;
  if (iface) {
    const props = new Map();
    for (const m of iface[3].matchAll(/^ {4}"([^"]+)"\??: (.*?);?$/gm)) props.set(m[1], m[2]);
    const bases = (iface[2] || "").split(",").map((s) => s.trim()).filter((s) => s && s !== "TypeMeta");
    decl = { file, imports, props, bases };
  }
  declarations.set(file, decl);
  return decl;
}
function resolveImport(fromFile, spec) {
  if (spec.startsWith(".")) return path.resolve(path.dirname(fromFile), spec.replace(/\.js$/, ".d.ts"));
  try {
    return require.resolve(`${spec}.d.ts`, { paths: [path.dirname(fromFile)] });
  } catch {
    const pkg = spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : spec.split("/")[0];
    const root = path.dirname(require.resolve(`${pkg}/package.json`, { paths: [here] }));
    return path.join(root, spec.slice(pkg.length + 1) + ".d.ts");
  }
}
function allProps(decl, seen = new Set()) {
  if (!decl || seen.has(decl.file)) return new Map();
  seen.add(decl.file);
  const props = new Map();
  for (const base of decl.bases) {
    if (!decl.imports.has(base)) continue;
    const baseDecl = declaration(resolveImport(decl.file, decl.imports.get(base)));
    for (const [k, v] of allProps(baseDecl, seen)) props.set(k, { ...v });
  }
  for (const [k, v] of decl.props) props.set(k, { type: v, from: decl });
  return props;
}
function unknownByDeclaration(value, decl, where, out) {
  if (!decl || value === null || typeof value !== "object" || Array.isArray(value)) return;
  const props = allProps(decl);
  for (const [key, v] of Object.entries(value)) {
    const prop = props.get(key);
    if (!prop) {
      out.push(`${where}.${key}: unknown field (${path.basename(decl.file, ".d.ts")} has no such field)`);
      continue;
    }
    const m = /^(Array<)?(I\w+)>?$/.exec(prop.type);
    if (!m || !prop.from.imports.has(m[2])) continue;  // primitive, union, inline map
    const next = declaration(resolveImport(prop.from.file, prop.from.imports.get(m[2])));
    if (m[1] && Array.isArray(v)) v.forEach((x, i) => unknownByDeclaration(x, next, `${where}.${key}[${i}]`, out));
    else if (!m[1]) unknownByDeclaration(v, next, `${where}.${key}`, out);
  }
}

function unknownFields(obj) {
  const out = [];
  const builtin = clientType(obj.apiVersion, obj.kind);
  if (builtin && !CRD_PACKAGES[obj.apiVersion.split("/")[0]]) {
    unknownByClientModel(obj, builtin, "", out);
    return out;
  }
  const file = resolveImport(path.join(here, "validate.mjs"), modelPath(obj.apiVersion, obj.kind));
  if (!fs.existsSync(file)) return [`no field list for ${obj.apiVersion} ${obj.kind}`];
  unknownByDeclaration(obj, declaration(file), "", out);
  return out;
}

// ---- 3. the set --------------------------------------------------------------------------------

const matches = (selector, labels) =>
  !!selector && Object.entries(selector).every(([k, v]) => (labels || {})[k] === v);
const labelSelectorMatches = (sel, labels) =>
  !!sel && matches(sel.matchLabels || {}, labels) &&
  (sel.matchExpressions || []).every((e) =>
    e.operator === "In" ? e.values.includes(labels?.[e.key]) :
    e.operator === "NotIn" ? !e.values.includes(labels?.[e.key]) :
    e.operator === "Exists" ? labels?.[e.key] !== undefined : labels?.[e.key] === undefined);

function podTemplate(obj) {
  if (["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"].includes(obj.kind)) return obj.spec?.template;
  if (obj.kind === "Job") return obj.spec?.template;
  if (obj.kind === "CronJob") return obj.spec?.jobTemplate?.spec?.template;
  return null;
}
const containerPorts = (tpl) =>
  new Set((tpl?.spec?.containers || []).flatMap((c) => (c.ports || []).map((p) => p.name)).filter(Boolean));
const parseSeconds = (s) => {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/.exec(String(s || ""));
  return m ? Number(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]] : null;
};

// Secrets the operator creates by hand (they hold secrets, so they are not in git): the
// tokens (components/mtls, docs/kubernetes.md).
const USER_SECRETS = new Set(["sluice-tokens", "sluice-trainer-token"]);

function checkSet(objs) {
  const out = [];
  const id = (o) => `${o.kind}/${o.metadata?.name}`;
  const byKind = (k) => objs.filter((o) => o.kind === k);
  const named = (k, n) => objs.find((o) => o.kind === k && o.metadata?.name === n);
  const workloads = objs.filter(podTemplate);
  const namespaced = objs.filter((o) => o.kind !== "Namespace");
  // Objects without a namespace (applied with -n) join the set's.
  const namespaces = new Set(namespaced.map((o) => o.metadata?.namespace).filter(Boolean));
  if (namespaces.size > 1) out.push(`objects span namespaces ${[...namespaces].join(", ")}`);

  for (const o of objs) {
    const labels = o.metadata?.labels || {};
    for (const key of ["app.kubernetes.io/part-of", "app.kubernetes.io/name"]) {
      if (!labels[key]) out.push(`${id(o)}: no ${key} label`);
    }
  }
  for (const w of workloads) {
    const tpl = podTemplate(w);
    const pod = tpl.spec || {};
    if (w.spec.selector && !labelSelectorMatches(w.spec.selector, tpl.metadata?.labels)) {
      out.push(`${id(w)}: spec.selector does not match its pod template labels`);
    }
    const sc = pod.securityContext || {};
    if (sc.runAsNonRoot !== true) out.push(`${id(w)}: pod securityContext.runAsNonRoot is not true`);
    if (sc.seccompProfile?.type !== "RuntimeDefault") out.push(`${id(w)}: pod seccompProfile is not RuntimeDefault`);
    const sa = pod.serviceAccountName;
    if (sa && !named("ServiceAccount", sa)) out.push(`${id(w)}: ServiceAccount ${sa} is not in the set`);
    const claims = new Set((w.spec.volumeClaimTemplates || []).map((c) => c.metadata.name));
    for (const v of pod.volumes || []) {
      if (v.configMap && !named("ConfigMap", v.configMap.name)) out.push(`${id(w)}: volume ${v.name}: ConfigMap ${v.configMap.name} is not in the set`);
      if (v.persistentVolumeClaim && !named("PersistentVolumeClaim", v.persistentVolumeClaim.claimName)) {
        out.push(`${id(w)}: volume ${v.name}: PersistentVolumeClaim ${v.persistentVolumeClaim.claimName} is not in the set`);
      }
    }
    const volumes = new Set([...(pod.volumes || []).map((v) => v.name), ...claims]);
    for (const c of pod.containers || []) {
      const where = `${id(w)} container ${c.name}`;
      const csc = c.securityContext || {};
      if (csc.readOnlyRootFilesystem !== true) out.push(`${where}: readOnlyRootFilesystem is not true`);
      if (csc.allowPrivilegeEscalation !== false) out.push(`${where}: allowPrivilegeEscalation is not false`);
      if (!(csc.capabilities?.drop || []).includes("ALL")) out.push(`${where}: capabilities do not drop ALL`);
      for (const kind of ["requests", "limits"]) {
        for (const r of ["cpu", "memory"]) {
          if (!c.resources?.[kind]?.[r]) out.push(`${where}: no resources.${kind}.${r}`);
        }
      }
      const ports = new Set((c.ports || []).map((p) => p.name));
      for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const p = c[probe];
        const port = p?.tcpSocket?.port ?? p?.httpGet?.port;
        if (typeof port === "string" && !ports.has(port)) out.push(`${where}: ${probe} names port ${port}, which the container lacks`);
      }
      for (const m of c.volumeMounts || []) {
        if (!volumes.has(m.name)) out.push(`${where}: volumeMount ${m.name} has no volume`);
      }
      for (const e of c.envFrom || []) {
        if (e.configMapRef && !named("ConfigMap", e.configMapRef.name)) out.push(`${where}: envFrom ConfigMap ${e.configMapRef.name} is not in the set`);
      }
      // A worker must be given longer to stop than its drain takes.
      const env = Object.fromEntries((c.envFrom || []).flatMap((e) =>
        Object.entries(named("ConfigMap", e.configMapRef?.name)?.data || {})));
      for (const e of c.env || []) if (e.value !== undefined) env[e.name] = e.value;
      const drain = parseSeconds(env.SLUICE_DRAIN_TIMEOUT);
      if (drain !== null && !((pod.terminationGracePeriodSeconds ?? 30) > drain)) {
        out.push(`${where}: terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds ?? 30} is not above SLUICE_DRAIN_TIMEOUT ${env.SLUICE_DRAIN_TIMEOUT}`);
      }
    }
  }
  const podsOf = (selector, match = matches) => workloads.filter((w) => match(selector, podTemplate(w).metadata?.labels));
  for (const s of byKind("Service")) {
    const pods = podsOf(s.spec?.selector);
    if (!pods.length) { out.push(`${id(s)}: selector matches no pod template`); continue; }
    for (const p of s.spec.ports || []) {
      if (typeof p.targetPort === "string" && !pods.every((w) => containerPorts(podTemplate(w)).has(p.targetPort))) {
        out.push(`${id(s)}: targetPort ${p.targetPort} is not a container port of every selected pod`);
      }
    }
  }
  for (const s of byKind("StatefulSet")) {
    const svc = named("Service", s.spec.serviceName);
    if (!svc) out.push(`${id(s)}: serviceName ${s.spec.serviceName} is not a Service in the set`);
    else if (svc.spec?.clusterIP !== "None") out.push(`${id(s)}: serviceName ${s.spec.serviceName} is not headless (clusterIP: None)`);
  }
  // Re-applying the manifests must not reset what the autoscaler chose.
  for (const a of [...byKind("ScaledObject"), ...byKind("HorizontalPodAutoscaler")]) {
    const target = named(a.spec.scaleTargetRef.kind || "Deployment", a.spec.scaleTargetRef.name);
    if (target && target.spec?.replicas !== undefined) {
      out.push(`${id(target)}: sets replicas (${target.spec.replicas}) but ${id(a)} scales it: drop spec.replicas`);
    }
  }
  for (const w of workloads) {
    const pc = podTemplate(w).spec?.priorityClassName;
    if (pc && !named("PriorityClass", pc)) out.push(`${id(w)}: PriorityClass ${pc} is not in the set`);
    const certSecrets = new Set(byKind("Certificate").map((c) => c.spec.secretName));
    for (const v of podTemplate(w).spec?.volumes || []) {
      const name = v.secret?.secretName;
      if (name && !certSecrets.has(name) && !named("Secret", name) && !USER_SECRETS.has(name)) {
        out.push(`${id(w)}: volume ${v.name}: Secret ${name} is neither a Certificate's secretName nor a Secret docs/kubernetes.md tells you to create`);
      }
    }
  }
  for (const p of byKind("PodDisruptionBudget")) {
    if (!podsOf(p.spec.selector, labelSelectorMatches).length) out.push(`${id(p)}: selector matches no pod template`);
  }
  for (const n of byKind("NetworkPolicy")) {
    const pods = podsOf(n.spec.podSelector, labelSelectorMatches);
    if (!pods.length) out.push(`${id(n)}: podSelector matches no pod template`);
    for (const rule of n.spec.ingress || []) {
      for (const p of rule.ports || []) {
        if (typeof p.port === "string" && !pods.every((w) => containerPorts(podTemplate(w)).has(p.port))) {
          out.push(`${id(n)}: port ${p.port} is not a container port of every selected pod`);
        }
      }
    }
  }
  for (const m of byKind("ServiceMonitor")) {
    const svcs = byKind("Service").filter((s) => labelSelectorMatches(m.spec.selector, s.metadata.labels));
    if (!svcs.length) out.push(`${id(m)}: selector matches no Service`);
    for (const e of m.spec.endpoints || []) {
      if (e.port && !svcs.every((s) => (s.spec.ports || []).some((p) => p.name === e.port))) {
        out.push(`${id(m)}: endpoint port ${e.port} is not a port of every selected Service`);
      }
    }
  }
  for (const m of byKind("PodMonitor")) {
    const pods = podsOf(m.spec.selector, labelSelectorMatches);
    if (!pods.length) out.push(`${id(m)}: selector matches no pod template`);
    for (const e of m.spec.podMetricsEndpoints || []) {
      if (e.port && !pods.every((w) => containerPorts(podTemplate(w)).has(e.port))) {
        out.push(`${id(m)}: port ${e.port} is not a container port of every selected pod`);
      }
    }
  }
  for (const a of [...byKind("ScaledObject"), ...byKind("HorizontalPodAutoscaler")]) {
    const ref = a.spec.scaleTargetRef;
    if (!named(ref.kind || "Deployment", ref.name)) out.push(`${id(a)}: scaleTargetRef ${ref.kind || "Deployment"}/${ref.name} is not in the set`);
  }
  return out;
}

// ---- main --------------------------------------------------------------------------------------

export function loadObjects(files) {
  return files.flatMap((f) => YAML.parseAllDocuments(fs.readFileSync(f, "utf8"))
    .map((d) => d.toJS()).filter((o) => o && typeof o === "object"));
}

export async function checkObjects(objs) {
  const problems = [];
  for (const o of objs) {
    const where = `${o.kind}/${o.metadata?.name}`;
    for (const e of await schemaErrors(o)) problems.push(`${where}: schema: ${e}`);
    for (const e of unknownFields(o)) problems.push(`${where}: ${e.replace(/^\./, "")}`);
  }
  problems.push(...checkSet(objs));
  return problems;
}

async function main(args) {
  if (!args.length) {
    console.error("usage: validate.mjs NAME=FILE.yaml[,FILE.yaml] ...");
    return 2;
  }
  let failed = 0;
  for (const arg of args) {
    const [name, list] = arg.includes("=") ? arg.split("=") : [arg, arg];
    const objs = loadObjects(list.split(","));
    const problems = await checkObjects(objs);
    for (const p of problems) console.log(`${name}: ${p}`);
    console.log(`${name}: ${objs.length} objects, ${problems.length ? `${problems.length} problems` : "ok"}`);
    failed += problems.length ? 1 : 0;
  }
  return failed ? 1 : 0;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = await main(process.argv.slice(2));
}
