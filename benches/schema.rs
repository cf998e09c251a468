//! Output schemas: what checking a run's output costs beside the run.
//!
//! `cargo bench --bench schema`. The run is the contained `boa-js` 100-number
//! transform (`input.items.map(x => x * 2)`, 100 numbers in and out), back
//! to back, without and with an output schema (`array` of `integer`s); the
//! ratio of the two is the check's share of a run. Beside it: the check
//! alone, compiling the schema (what an MCP call that sends one pays on
//! each call), and a 10 MB output (200,000 objects) against an object
//! schema.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::backends::{BoaJs, BoaJsConfig};
use execbox::{Backend, ExecRequest, Executor, JsonSchema, Outcome, SandboxPolicy};
use serde_json::{Value, json};

const TRANSFORM: &str = "return input.items.map(x => x * 2);";

fn schema_value() -> Value {
    json!({"type": "array", "items": {"type": "integer"}, "maxItems": 1000})
}

fn request(schema: Option<&JsonSchema>) -> ExecRequest {
    let request = ExecRequest::javascript(TRANSFORM)
        .input(json!({"items": (0..100).collect::<Vec<i32>>()}))
        .policy(SandboxPolicy::strict());
    match schema {
        Some(schema) => request.output_schema(schema.clone()),
        None => request,
    }
}

fn bench(c: &mut Criterion) {
    let schema = JsonSchema::new(schema_value()).expect("a schema");
    let mut g = c.benchmark_group("schema");

    let contained = BoaJs::default();
    let until = Instant::now() + Duration::from_secs(30);
    while contained.readiness().map(|r| r.ready) != Some(BoaJsConfig::default().idle_workers) && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let exec = Executor::builder().backend(contained).build();
    assert_eq!(exec.execute_blocking(request(Some(&schema))).unwrap().outcome, Outcome::Ok);
    g.bench_function("transform/plain", |b| b.iter(|| black_box(exec.execute_blocking(request(None)).unwrap())));
    g.bench_function("transform/with_output_schema", |b| {
        b.iter(|| black_box(exec.execute_blocking(request(Some(&schema))).unwrap()))
    });

    let output = json!((0..100).map(|x| x * 2).collect::<Vec<i32>>());
    g.bench_function("validate_100_numbers", |b| b.iter(|| black_box(schema.validate(black_box(&output)))));
    g.bench_function("compile_small_schema", |b| b.iter(|| black_box(JsonSchema::new(schema_value()).unwrap())));

    let objects = JsonSchema::new(json!({"type": "array", "items": {"type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 64}},
        "required": ["id", "name"]}}))
    .unwrap();
    let big = json!((0..200_000).map(|i| json!({"id": i, "name": format!("item number {i:>12}")})).collect::<Vec<_>>());
    assert!(serde_json::to_vec(&big).unwrap().len() > 9 << 20);
    assert!(objects.validate(&big).is_ok());
    g.sample_size(10);
    g.bench_function("validate_10mb_of_objects", |b| b.iter(|| black_box(objects.validate(black_box(&big)))));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(60).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
