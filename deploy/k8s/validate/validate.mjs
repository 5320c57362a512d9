// SPDX-License-Identifier: Apache-2.0
// validate.mjs -- checks fedbox's Kubernetes manifests offline: builds what
// `kubectl apply -k DIR` would send (the kustomization's resources, its
// ConfigMap and Secret generators, its namespace) and validates every
// object against the Kubernetes OpenAPI schemas compiled into the
// kubernetes-models package. Beyond the schemas it refuses fields the
// schema does not know (a typo such as `resource:` passes the schemas
// alone) and references to ConfigMaps, Secrets, Services and container
// ports that the objects do not define.
//
//   node validate.mjs DIR|FILE...   a kustomization folder, or a file of
//                                   objects (e.g. `kubectl kustomize DIR`)
// Exit 0 all valid, 1 invalid, 2 bad usage.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import YAML from "yaml";

const require = createRequire(import.meta.url);
const modelsVersion = require("kubernetes-models/package.json").version;
const errors = [];
const fail = (where, msg) => errors.push(`${where}: ${msg}`);

// ---- kustomize's part: resources, generators, namespace -------------------
const kustomizeKeys = new Set(["apiVersion", "kind", "namespace",
	"resources", "generatorOptions", "configMapGenerator",
	"secretGenerator", "labels", "commonLabels", "images"]);

function readDocs(file) {
	const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
	const out = [];
	docs.forEach((d, i) => {
		if (d.errors.length > 0) {
			fail(`${file}#${i + 1}`, `YAML: ${d.errors[0].message}`);
			return;
		}
		const obj = d.toJS();
		// kustomize folds a Secret's base64 at 70 columns; the API server's
		// decoder skips the line breaks, the schema's "byte" pattern does
		// not: join the lines as the server would.
		if (obj?.kind === "Secret" && obj.data && typeof obj.data === "object") {
			for (const k of Object.keys(obj.data)) {
				if (typeof obj.data[k] === "string") {
					obj.data[k] = obj.data[k].replace(/[\r\n]/g, "");
				}
			}
		}
		if (obj !== null && obj !== undefined) {
			out.push({ where: `${file}#${i + 1}`, obj });
		}
	});
	return out;
}

function generated(dir, kind, gen, opts, k) {
	const where = `${k}: ${kind === "Secret" ? "secretGenerator" : "configMapGenerator"} ${gen.name}`;
	const data = {};
	for (const f of gen.files || []) {
		const [key, rel] = f.includes("=") ? f.split("=", 2) : [path.basename(f), f];
		const p = path.resolve(dir, rel);
		if (!p.startsWith(path.resolve(dir) + path.sep)) {
			fail(where, `${f} is outside the kustomization's folder`);
			continue;
		}
		if (!fs.existsSync(p)) {
			fail(where, `${f} does not exist (make the kit first: see the README)`);
			continue;
		}
		const bytes = fs.readFileSync(p);
		data[key] = kind === "Secret" ? bytes.toString("base64") : bytes.toString("utf8");
	}
	for (const l of gen.literals || []) {
		const i = l.indexOf("=");
		data[l.slice(0, i)] = kind === "Secret"
			? Buffer.from(l.slice(i + 1)).toString("base64") : l.slice(i + 1);
	}
	const labels = { ...(opts.labels || {}), ...(gen.options?.labels || {}) };
	const obj = { apiVersion: "v1", kind, metadata: { name: gen.name }, data };
	if (Object.keys(labels).length > 0) {
		obj.metadata.labels = labels;
	}
	if (kind === "Secret") {
		obj.type = gen.type || "Opaque";
	}
	if (!(opts.disableNameSuffixHash === true)) {
		fail(where, "set generatorOptions.disableNameSuffixHash: true (the " +
			"manifests name the generated objects without a hash)");
	}
	return { where, obj };
}

function kustomize(dir) {
	const k = path.join(dir, "kustomization.yaml");
	if (!fs.existsSync(k)) {
		fail(dir, "no kustomization.yaml");
		return [];
	}
	const [kdoc] = readDocs(k);
	if (!kdoc) {
		return [];
	}
	const kz = kdoc.obj;
	for (const key of Object.keys(kz)) {
		if (!kustomizeKeys.has(key)) {
			fail(k, `unknown kustomization field '${key}'`);
		}
	}
	if (kz.kind !== "Kustomization") {
		fail(k, `kind is ${kz.kind}, not Kustomization`);
	}
	let objs = [];
	for (const r of kz.resources || []) {
		const p = path.join(dir, r);
		if (!fs.existsSync(p)) {
			fail(k, `resource ${r} does not exist`);
		} else if (fs.statSync(p).isDirectory()) {
			objs = objs.concat(kustomize(p));
		} else {
			objs = objs.concat(readDocs(p));
		}
	}
	const opts = kz.generatorOptions || {};
	for (const g of kz.configMapGenerator || []) {
		objs.push(generated(dir, "ConfigMap", g, opts, k));
	}
	for (const g of kz.secretGenerator || []) {
		objs.push(generated(dir, "Secret", g, opts, k));
	}
	if (kz.namespace) {
		for (const { obj } of objs) {
			if (obj.kind !== "Namespace" && obj.metadata) {
				obj.metadata.namespace = kz.namespace;
			}
		}
	}
	return objs;
}

// ---- schema validation, with unknown fields refused --------------------------
// The compiled validators read each property they know by name and list
// the keys of maps (labels, data); a key of an object that was neither
// read nor listed is a field the schema does not have.
function watch(value, seen) {
	if (value === null || typeof value !== "object") {
		return value;
	}
	const rec = { read: new Set(), map: false, target: value };
	for (const key of Object.keys(value)) {
		value[key] = watch(value[key], seen);
	}
	const proxy = new Proxy(value, {
		get(t, key, r) {
			if (typeof key === "string") {
				rec.read.add(key);
			}
			return Reflect.get(t, key, r);
		},
		ownKeys(t) {
			rec.map = true;
			return Reflect.ownKeys(t);
		},
		has(t, key) {
			if (typeof key === "string") {
				rec.read.add(key);
			}
			return Reflect.has(t, key);
		},
	});
	seen.set(proxy, rec);
	return proxy;
}

// unknownFields lists the keys nobody read, walking the targets behind the
// proxies (so that the walk itself reads nothing).
function unknownFields(proxy, seen, at, out) {
	const rec = seen.get(proxy);
	if (rec === undefined) {
		return;
	}
	const t = rec.target;
	for (const key of Object.keys(t)) {
		const here = Array.isArray(t) ? `${at}[${key}]` : `${at}.${key}`;
		if (!Array.isArray(t) && !rec.map && !rec.read.has(key)) {
			out.push(here.replace(/^\./, ""));
			continue;
		}
		unknownFields(t[key], seen, here, out);
	}
}

async function modelOf(obj) {
	const [group, version] = obj.apiVersion.includes("/")
		? obj.apiVersion.split("/") : [null, obj.apiVersion];
	const spec = group === null ? `kubernetes-models/${version}/${obj.kind}`
		: `kubernetes-models/${group}/${version}/${obj.kind}`;
	try {
		return (await import(spec))[obj.kind];
	} catch {
		return null;
	}
}

async function validate({ where, obj }) {
	if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
		fail(where, "no apiVersion or kind");
		return;
	}
	const name = `${obj.kind} ${obj.metadata?.name ?? "(no name)"}`;
	const Model = await modelOf(obj);
	if (Model === null) {
		fail(where, `${name}: ${obj.apiVersion} ${obj.kind} is not a Kubernetes type`);
		return;
	}
	const plain = structuredClone(obj);
	const seen = new WeakMap();
	const watched = watch(plain, seen);
	try {
		// The model's validate on the watched object itself: a `new
		// Model(...)` would copy (and so read) every field first.
		Model.prototype.validate.call(watched);
	} catch (e) {
		fail(where, `${name}: ${e.message}`);
	}
	const unknown = [];
	unknownFields(watched, seen, "", unknown);
	for (const u of unknown) {
		fail(where, `${name}: unknown field ${u}`);
	}
}

// ---- references between the objects --------------------------------------------
function podSpecs(obj) {
	const t = obj.spec?.template?.spec;
	return t && typeof t === "object" ? [t] : [];
}

function checkRefs(objs) {
	const have = (kind, name) => objs.some(({ obj }) =>
		obj.kind === kind && obj.metadata?.name === name);
	for (const { where, obj } of objs) {
		for (const ps of podSpecs(obj)) {
			const name = `${obj.kind} ${obj.metadata.name}`;
			const vols = [...(ps.volumes || [])];
			for (const v of vols) {
				const srcs = v.projected?.sources || [v];
				for (const s of srcs) {
					if (s.configMap && !have("ConfigMap", s.configMap.name)) {
						fail(where, `${name}: volume ${v.name} names ConfigMap ${s.configMap.name}, which is not defined`);
					}
					const sec = s.secret?.secretName ?? s.secret?.name;
					if (sec && !have("Secret", sec)) {
						fail(where, `${name}: volume ${v.name} names Secret ${sec}, which is not defined`);
					}
					for (const it of (s.configMap || s.secret)?.items || []) {
						const src = objs.find(({ obj: o }) =>
							(o.kind === "ConfigMap" && o.metadata.name === s.configMap?.name) ||
							(o.kind === "Secret" && o.metadata.name === sec));
						if (src && !(it.key in (src.obj.data || {}))) {
							fail(where, `${name}: volume ${v.name} wants key ${it.key}, not in ${src.obj.kind} ${src.obj.metadata.name}`);
						}
					}
				}
			}
			const names = new Set([...(ps.volumes || []).map((v) => v.name),
				...(obj.spec.volumeClaimTemplates || []).map((c) => c.metadata?.name)]);
			for (const c of [...(ps.initContainers || []), ...(ps.containers || [])]) {
				for (const m of c.volumeMounts || []) {
					if (!names.has(m.name)) {
						fail(where, `${name}: container ${c.name} mounts ${m.name}, which is no volume`);
					}
				}
			}
		}
		if (obj.kind === "StatefulSet" && !have("Service", obj.spec?.serviceName)) {
			fail(where, `StatefulSet ${obj.metadata.name}: serviceName ${obj.spec?.serviceName} is not a Service here`);
		}
		if (obj.kind === "Service") {
			const sel = obj.spec?.selector || {};
			const pods = objs.filter(({ obj: o }) => {
				const l = o.spec?.template?.metadata?.labels || {};
				return Object.keys(sel).length > 0 &&
					Object.entries(sel).every(([k, v]) => l[k] === v);
			});
			if (pods.length === 0) {
				fail(where, `Service ${obj.metadata.name}: its selector matches no pod template`);
			}
			for (const p of obj.spec?.ports || []) {
				if (typeof p.targetPort !== "string") {
					continue;
				}
				const named = pods.some(({ obj: o }) => podSpecs(o).some((ps) =>
					(ps.containers || []).some((c) => (c.ports || []).some((cp) => cp.name === p.targetPort))));
				if (!named) {
					fail(where, `Service ${obj.metadata.name}: targetPort ${p.targetPort} is no container port of its pods`);
				}
			}
		}
	}
}

// ---- main ------------------------------------------------------------------------
const dirs = process.argv.slice(2);
if (dirs.length === 0) {
	console.error("usage: node validate.mjs KUSTOMIZATION-DIR|FILE...");
	process.exit(2);
}
let count = 0;
for (const dir of dirs) {
	const objs = fs.existsSync(dir) && fs.statSync(dir).isFile()
		? readDocs(dir) : kustomize(dir);
	for (const o of objs) {
		await validate(o);
	}
	try {
		checkRefs(objs);
	} catch (e) {
		fail(dir, `cross-references not checked, the objects are malformed: ${e.message}`);
	}
	count += objs.length;
	const kinds = {};
	for (const { obj } of objs) {
		kinds[obj.kind] = (kinds[obj.kind] || 0) + 1;
	}
	console.log(`${dir}: ${objs.length} objects (` +
		Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", ") + ")");
}
for (const e of errors) {
	console.log(`INVALID ${e}`);
}
console.log(`${errors.length === 0 ? "valid" : "invalid"}: ${count} objects ` +
	`checked against the Kubernetes OpenAPI schemas of kubernetes-models ` +
	`${modelsVersion}, ${errors.length} problems`);
process.exit(errors.length === 0 ? 0 : 1);
