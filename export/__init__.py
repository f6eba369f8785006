"""Per-tier export: ExecuTorch .pte (XNNPACK, fp32 / PT2E int8), Core ML .mlpackage, the server
back-end, a signed manifest and a verification report.

Modules (import them directly; this package imports nothing heavy so `harmony --help` stays fast):

    keys       Ed25519 signing keys (generated on first use, 0600)
    manifest   manifest schema, build / sign / verify (`sign_manifest`, `verify_manifest`)
    steps      the ExecuTorch pipeline steps (export, PT2E int8, XNNPACK lowering, delegation check)
    coreml     Core ML conversion and weight compression
    verify     the verification report (ExecuTorch runtime vs eager)
    pipeline   `export_run`: a run directory -> a signed export directory
"""
