import HarmonyKit
import PhotosUI
import SwiftUI

@MainActor
struct ContentView: View {
    @ObservedObject var model: DemoModel
    @State private var photoItem: PhotosPickerItem?
    @State private var showCamera = false
    @State private var adminToken = ""

    var body: some View {
        NavigationStack {
            Form {
                modelSection
                inputSection
                resultSection
                serverSection
            }
            .navigationTitle("HARMONY demo")
            .disabled(model.busy)
            .overlay { if model.busy { ProgressView() } }
            .sheet(isPresented: $showCamera) {
                CameraPicker { image in
                    showCamera = false
                    if let image {
                        Task { await model.classify(photo: image) }
                    }
                }
                .ignoresSafeArea()
            }
            .onChange(of: photoItem) { _, item in
                guard let item else { return }
                Task {
                    if let data = try? await item.loadTransferable(type: Data.self), let image = UIImage(data: data) {
                        await model.classify(photo: image)
                    }
                    photoItem = nil
                }
            }
        }
    }

    // MARK: - Sections

    private var modelSection: some View {
        Section("Model") {
            Text(model.status).font(.footnote).foregroundStyle(.secondary)
            if !model.provisioned {
                Label("Not provisioned: no federation secret", systemImage: "key.slash").foregroundStyle(.red)
            }
            if !model.runnableTiers.isEmpty {
                Picker("Tier", selection: Binding(
                    get: { model.selectedTier },
                    set: { name in Task { await model.select(tier: name) } }
                )) {
                    ForEach(model.runnableTiers, id: \.name) { tier in
                        Text(tier.name + (tier.name == model.recommendedTier ? " (recommended)" : "")).tag(tier.name)
                    }
                }
                Picker("Runtime", selection: Binding(
                    get: { model.selectedBackend },
                    set: { backend in Task { await model.select(backend: backend) } }
                )) {
                    ForEach(model.backends, id: \.self) { backend in
                        Text(backend == Artifact.backendCoreML ? "Core ML" : "ExecuTorch (XNNPACK)").tag(backend)
                    }
                }
                if let deviceClass = model.deviceClass {
                    LabeledContent("Device class", value: deviceClass.rawValue)
                }
                if !model.engineDescription.isEmpty {
                    Text(model.engineDescription).font(.caption).foregroundStyle(.secondary)
                }
                Button("Check for a model update") {
                    Task { await model.checkForUpdate() }
                }
                .disabled(model.credentials == nil)
            }
        }
    }

    private var inputSection: some View {
        Section("Image") {
            ScrollView(.horizontal, showsIndicators: false) {
                HStack {
                    ForEach(model.samples) { sample in
                        Button {
                            Task { await model.classify(sample) }
                        } label: {
                            PixelImageView(image: sample.image).frame(width: 44, height: 44)
                        }
                        .buttonStyle(.plain)
                    }
                }
            }
            HStack {
                PhotosPicker(selection: $photoItem, matching: .images) {
                    Label("Photo", systemImage: "photo")
                }
                Spacer()
                Button {
                    showCamera = true
                } label: {
                    Label("Camera", systemImage: "camera")
                }
                .disabled(!CameraPicker.isAvailable)
            }
            .buttonStyle(.borderless)
            if let image = model.image {
                HStack {
                    PixelImageView(image: image).frame(width: 112, height: 112)
                    if let label = model.imageLabel {
                        Text("true label \(label)").foregroundStyle(.secondary)
                    }
                }
            }
        }
    }

    @ViewBuilder private var resultSection: some View {
        if let result = model.result {
            Section("Answer") {
                LabeledContent("Answer", value: "\(result.predictedClass) (\(source(result.source)))")
                LabeledContent(
                    "Local",
                    value: "\(result.localClass), \(localScore(result.local.confidence)), "
                        + "\(milliseconds(result.localLatencyNanos)), "
                        + (result.local.exitLocally ? "exit" : "below threshold"))
                if let server = result.server {
                    LabeledContent(
                        "Server",
                        value: "slot \(server.topSlot), p = \(percent(server.confidence)), "
                            + "\(milliseconds(result.serverLatencyNanos)), \(server.modelVersion)")
                } else if let error = result.serverError {
                    Text("Server: \(error)").font(.caption).foregroundStyle(.secondary)
                }
            }
        }
    }

    private var serverSection: some View {
        Section("Server and confirmed labels") {
            TextField("Server URL", text: $model.serverURL)
                .keyboardType(.URL)
                .textInputAutocapitalization(.never)
                .autocorrectionDisabled()
            if let credentials = model.credentials {
                LabeledContent("Enrolled as", value: credentials.deviceID)
                Button("Forget enrolment", role: .destructive) {
                    Task { await model.forgetEnrollment() }
                }
            } else {
                SecureField("Admin token (serve-data/admin_token)", text: $adminToken)
                Button("Enrol this device") {
                    Task { await model.enroll(adminToken: adminToken) }
                    adminToken = ""
                }
                .disabled(adminToken.isEmpty)
            }
            if model.result != nil {
                Stepper("Confirmed label: \(model.confirmedLabel)", value: $model.confirmedLabel, in: 0...9)
                Button("Confirm label and upload") {
                    Task { await model.confirmAndUpload() }
                }
                .disabled(model.credentials == nil)
            }
            LabeledContent("Queued uploads", value: "\(model.queued)")
            Button("Send queued uploads") {
                Task { await model.flush() }
            }
            .disabled(model.credentials == nil || model.queued == 0)
        }
    }

    // MARK: - Formatting

    private func source(_ source: Classification.Source) -> String {
        switch source {
        case .localExit: return "on the phone"
        case .server: return "server back-end"
        case .localAfterServerFailure: return "on the phone, server unavailable"
        case .localServerUnnamed: return "on the phone, the server's slot names no class here"
        }
    }

    /// The local exit score: the slot gate's is a margin in [-2, 2], not a probability.
    private func localScore(_ confidence: Double) -> String {
        guard model.tier?.exitRule == .slotMargin else { return "p = \(percent(confidence))" }
        return confidence.isFinite ? String(format: "margin = %.2f", confidence) : "margin n/a"
    }

    private func percent(_ value: Double) -> String {
        value.isFinite ? String(format: "%.1f%%", value * 100) : "n/a"
    }

    private func milliseconds(_ nanos: UInt64) -> String {
        String(format: "%.1f ms", Double(nanos) / 1_000_000)
    }
}

/// An 8-bit image, magnified without smoothing.
struct PixelImageView: View {
    let image: PixelImage

    var body: some View {
        if let cgImage = image.cgImage {
            Image(decorative: cgImage, scale: 1)
                .interpolation(.none)
                .resizable()
                .aspectRatio(contentMode: .fit)
        } else {
            Color.gray
        }
    }
}
