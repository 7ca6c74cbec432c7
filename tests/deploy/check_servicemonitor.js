// Validates ServiceMonitor resources (a JSON array of them on stdin) against
// the prometheus-operator CRD's schema, as the @kubernetes-models package
// compiles it (types, required fields, enums; unknown fields are not
// refused: the API server prunes them). Prints "ok NAME" per resource; exits
// 1 with the first error.
//
// usage: node check_servicemonitor.js < monitors.json   (NODE_PATH: the
// node_modules folder setup.sh installs into .deps/npm)
const { ServiceMonitor } = require(
  "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
);

let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const docs = JSON.parse(input);
  if (docs.length === 0) {
    console.error("no ServiceMonitor to check");
    process.exit(1);
  }
  for (const d of docs) {
    try {
      new ServiceMonitor(d).validate();
    } catch (e) {
      console.error(`ServiceMonitor ${d.metadata && d.metadata.name}: ${e.message}`);
      process.exit(1);
    }
    console.log(`ok ServiceMonitor ${d.metadata.name}`);
  }
});
