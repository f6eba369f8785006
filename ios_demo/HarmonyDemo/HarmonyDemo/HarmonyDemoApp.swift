import SwiftUI

@main
struct HarmonyDemoApp: App {
    @StateObject private var model = DemoModel()

    var body: some Scene {
        WindowGroup {
            ContentView(model: model)
                .task { await model.start() }
                // harmony-mobile://provision/v1#<payload>: the provisioning link (a QR code the camera app opens)
                .onOpenURL { url in Task { await model.provision(link: url.absoluteString) } }
        }
    }
}
