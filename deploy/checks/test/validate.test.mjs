// The checker must fail on each kind of mistake it claims to catch: every test breaks one thing
// in the rendered production overlay and expects exactly that problem.
//   node --test deploy/checks/test/   (deploy/check.sh renders the overlay into SLUICE_RENDERED)
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import { checkObjects } from "../validate.mjs";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const kubectl = process.env.KUBECTL || "kubectl";
const rendered = execFileSync(kubectl, ["kustomize", path.join(root, "deploy/kubernetes/overlays/production")],
  { encoding: "utf8" });
const fresh = () => YAML.parseAllDocuments(rendered).map((d) => d.toJS());
const find = (objs, kind, name) => objs.find((o) => o.kind === kind && o.metadata.name === name);
const worker = (objs) => find(objs, "Deployment", "sluice-worker");

test("the production overlay passes", async () => {
  assert.deepEqual(await checkObjects(fresh()), []);
});

test("a field of the wrong type fails the schema", async () => {
  const objs = fresh();
  worker(objs).spec.replicas = "two";
  const problems = await checkObjects(objs);
  assert.ok(problems.some((p) => p.startsWith("Deployment/sluice-worker: schema: /spec/replicas")), problems.join("\n"));
});

test("an unknown field of a built-in kind is rejected", async () => {
  const objs = fresh();
  worker(objs).spec.template.spec.containers[0].readinesProbe = { grpc: { port: 7080 } };
  assert.deepEqual(await checkObjects(objs), [
    "Deployment/sluice-worker: spec.template.spec.containers[0].readinesProbe: unknown field (V1Container has no such field)",
  ]);
});

test("an unknown field of a CRD is rejected", async () => {
  const objs = fresh();
  find(objs, "ScaledObject", "sluice-worker").spec.triggers[0].threshold = "1";
  find(objs, "ServiceMonitor", "sluice-dispatcher").spec.endpoints[0].intervall = "15s";
  assert.deepEqual(await checkObjects(objs), [
    "ScaledObject/sluice-worker: spec.triggers[0].threshold: unknown field (ScaleTriggers has no such field)",
    "ServiceMonitor/sluice-dispatcher: spec.endpoints[0].intervall: unknown field (Endpoint has no such field)",
  ]);
});

test("a Service whose selector matches no pod fails", async () => {
  const objs = fresh();
  find(objs, "Service", "sluice-worker").spec.selector["app.kubernetes.io/component"] = "workers";
  assert.deepEqual(await checkObjects(objs), ["Service/sluice-worker: selector matches no pod template"]);
});

test("a named port that the pods lack fails, wherever it is named", async () => {
  const objs = fresh();
  const ports = worker(objs).spec.template.spec.containers[0].ports;
  ports.find((p) => p.name === "metrics").name = "prom";
  assert.deepEqual(await checkObjects(objs), [
    "Service/sluice-worker: targetPort metrics is not a container port of every selected pod",
    "NetworkPolicy/sluice-worker: port metrics is not a container port of every selected pod",
    "PodMonitor/sluice-worker: port metrics is not a container port of every selected pod",
  ]);
});

test("a grace period shorter than the drain fails", async () => {
  const objs = fresh();
  worker(objs).spec.template.spec.terminationGracePeriodSeconds = 20;
  assert.deepEqual(await checkObjects(objs), [
    "Deployment/sluice-worker container worker: terminationGracePeriodSeconds 20 is not above SLUICE_DRAIN_TIMEOUT 30s",
  ]);
});

test("a writable root filesystem and a missing limit fail", async () => {
  const objs = fresh();
  const c = find(objs, "StatefulSet", "sluice-dispatcher").spec.template.spec.containers[0];
  c.securityContext.readOnlyRootFilesystem = false;
  delete c.resources.limits.memory;
  assert.deepEqual(await checkObjects(objs), [
    "StatefulSet/sluice-dispatcher container dispatcher: readOnlyRootFilesystem is not true",
    "StatefulSet/sluice-dispatcher container dispatcher: no resources.limits.memory",
  ]);
});

test("a scale target that does not exist fails", async () => {
  const objs = fresh();
  find(objs, "ScaledObject", "sluice-worker").spec.scaleTargetRef.name = "sluice-workers";
  assert.deepEqual(await checkObjects(objs), [
    "ScaledObject/sluice-worker: scaleTargetRef Deployment/sluice-workers is not in the set",
  ]);
});

test("a kind without a schema fails", async () => {
  const objs = fresh();
  objs.push({ apiVersion: "example.com/v1", kind: "Widget", metadata: { name: "w", labels: {
    "app.kubernetes.io/name": "sluice", "app.kubernetes.io/part-of": "sluice" } } });
  const problems = await checkObjects(objs);
  assert.ok(problems.some((p) => p.startsWith("Widget/w: schema: no schema for example.com/v1 Widget")), problems.join("\n"));
});

test("replicas on an autoscaled Deployment fail", async () => {
  const objs = fresh();
  worker(objs).spec.replicas = 2;
  assert.deepEqual(await checkObjects(objs), [
    "Deployment/sluice-worker: sets replicas (2) but ScaledObject/sluice-worker scales it: drop spec.replicas",
  ]);
});

test("a StatefulSet governed by a ClusterIP Service fails", async () => {
  const objs = fresh();
  find(objs, "StatefulSet", "sluice-dispatcher").spec.serviceName = "sluice-dispatcher";
  assert.deepEqual(await checkObjects(objs), [
    "StatefulSet/sluice-dispatcher: serviceName sluice-dispatcher is not headless (clusterIP: None)",
  ]);
});

test("a missing priority class and an unknown secret fail", async () => {
  const objs = fresh();
  objs.splice(objs.findIndex((o) => o.kind === "PriorityClass"), 1);
  find(objs, "Certificate", "sluice-worker").spec.secretName = "sluice-workers-tls";
  assert.deepEqual(await checkObjects(objs), [
    "Deployment/sluice-worker: volume tls: Secret sluice-worker-tls is neither a Certificate's secretName nor a Secret docs/kubernetes.md tells you to create",
    "StatefulSet/sluice-dispatcher: PriorityClass sluice-dispatcher is not in the set",
  ]);
});

test("an unknown field of a cert-manager Certificate is rejected", async () => {
  const objs = fresh();
  find(objs, "Certificate", "sluice-worker").spec.dnsName = ["sluice.sluice.svc"];
  assert.deepEqual(await checkObjects(objs), [
    "Certificate/sluice-worker: spec.dnsName: unknown field (CertificateSpec has no such field)",
  ]);
});
