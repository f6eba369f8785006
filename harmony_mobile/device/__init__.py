"""The Python device runtime: what a phone does, using only the exported artifacts and the wire protocol.

Its modules mirror android_demo/harmony-core's Java packages (and ios_demo/HarmonyKit's folders),
so the demo and the tests exercise the same behaviour as the apps, without the training code:

  module      harmony-core (org.harmonymobile.core.*)          HarmonyKit (Sources/HarmonyKit/*)
  manifest    manifest: ManifestVerifier, Manifest, ...         Manifest/
  engine      engine: InferenceEngine                           Engine/, HarmonyKitExecuTorch
  queue       queue: UploadQueue, PendingUpload                 Queue/
  fallback_client  server: HarmonyServerClient, DeviceCredentials    Net/HarmonyHTTPClient.swift
  phone       HarmonyClient, ConfirmedUploads, SlotDecoder,     Client/, Exit/
              FederationKey; exit: ExitPolicy
  errors      the per-package exceptions                        HarmonyFormatError, ServerError
  personalization   harmony-core personalization: Personalizer, TrainingModule, Optimizer,
                    HeadProgram, ThresholdCalibration; HarmonyKit Personalization/ (contract only)

What a phone does:

  * `load_manifest`: verify manifest.sig over the exact bytes of manifest.json with the *pinned*
    Ed25519 key, then parse it; `load_front_end` checks the artifact's sha256 and size against the
    manifest before handing the .pte to the ExecuTorch runtime. `choose_artifact` takes a variant
    that passed the export's checks first (the manifest's verdicts).
  * `ModelStore`: updates. A newer signed manifest (`fetch_signed_manifest`) and its artifact (from
    the server's GET /v1/artifacts: `fetch_server_artifact`) are installed only when the manifest_version is higher than the installed one (older or reused:
    RollbackError), verified, then switched to with one atomic rename.
  * `Phone.classify`: normalize the pixels as the manifest says, run the .pte, answer locally when
    max softmax(exit_logits) >= the exit threshold (the manifest's tier threshold, or the one the
    phone recalibrated after personalizing its front-end on device: `Phone.use_local_front_end`),
    else POST the features as a binary HMFT body to the server's infer endpoint (docs/PROTOCOL.md
    6.2; inference bodies are not sealed, uploads are). The server answers in slots; the phone
    turns the top slot into a class with its federation secret (the token of every manifest class
    name under the label epoch, looked up in the version's slot table; a version it has not seen
    yet: its slot table from the V2 model metadata first). A slot no class name maps to keeps
    the local answer and says so. Any server failure (down, timeout, 4xx/5xx) answers with the
    local exit instead.
  * `Phone.confirm` + `Phone.flush`: features of samples whose label the user confirmed become a
    sealed upload (label tokens of the class names under the provisioned federation secret and
    the manifest's label epoch; randomized response and feature clipping + noise when the manifest
    says the lineage trained with them; envelope bound to device id, label epoch and message id),
    stored in a bounded file-backed `UploadQueue` and sent when the server answers. An entry is
    deleted only on a 2xx acknowledgement; a resend uses the same bytes and message id, which the
    server stores once (PROTOCOL.md 4.6).

  * `personalization.personalize_phone`: train the exit classifier on the phone's own samples
    through the export's ExecuTorch training .pte (TrainingModule + SGD; labels are exit positions
    through the secret), answer with the trained parameters, recalibrate tau on own samples.

The package imports the protocol and privacy layers only: neither `harmony_mobile.export`, nor
`harmony_mobile.server`, nor the training code (import-linter contracts in pyproject.toml).
"""

from harmony_mobile.device.engine import FrontEndProgram, load_front_end
from harmony_mobile.device.errors import DeviceError
from harmony_mobile.device.fallback_client import MODEL_NAME, DeviceCredentials, enrol, parse_slot_table
from harmony_mobile.device.manifest import (
    MANIFEST_FILE,
    PUBLIC_KEY_FILE,
    SIGNATURE_FILE,
    RollbackError,
    choose_artifact,
    decode_public_key,
    find_tier_entry,
    is_update,
    load_manifest,
    load_slot_prototypes,
    manifest_version,
    normalize,
    pte_artifact,
    read_verified_artifact,
    upload_privacy,
    verify_manifest_bytes,
)
from harmony_mobile.device.model_store import (
    ARTIFACTS_PATH,
    InstalledModel,
    ModelStore,
    fetch_server_artifact,
    fetch_signed_manifest,
)
from harmony_mobile.device.phone import (
    PERMANENT_UPLOAD_STATUSES,
    Classification,
    FederationKey,
    FlushResult,
    Phone,
    PhoneStats,
    exit_threshold,
)
from harmony_mobile.device.queue import PendingUpload, QueueFullError, UploadQueue

__all__ = [
    "ARTIFACTS_PATH",
    "MANIFEST_FILE",
    "MODEL_NAME",
    "PERMANENT_UPLOAD_STATUSES",
    "PUBLIC_KEY_FILE",
    "SIGNATURE_FILE",
    "Classification",
    "InstalledModel",
    "ModelStore",
    "RollbackError",
    "choose_artifact",
    "fetch_server_artifact",
    "fetch_signed_manifest",
    "is_update",
    "manifest_version",
    "DeviceCredentials",
    "DeviceError",
    "FederationKey",
    "FlushResult",
    "FrontEndProgram",
    "PendingUpload",
    "Phone",
    "PhoneStats",
    "QueueFullError",
    "UploadQueue",
    "decode_public_key",
    "enrol",
    "exit_threshold",
    "load_front_end",
    "load_manifest",
    "load_slot_prototypes",
    "normalize",
    "parse_slot_table",
    "pte_artifact",
    "read_verified_artifact",
    "find_tier_entry",
    "upload_privacy",
    "verify_manifest_bytes",
]
