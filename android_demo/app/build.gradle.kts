plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

/** ExecuTorch runtime matching the exporter: the Python side pins executorch==1.5.1 (pyproject.toml). */
val executorchVersion = "1.5.1"

fun quoted(value: String) = "\"" + value.replace("\\", "\\\\").replace("\"", "\\\"") + "\""

/** android_demo/harmony.properties (written by `harmony export-app android`, not committed) wins over gradle.properties. */
val exportedApp = java.util.Properties().apply {
    val file = rootProject.file("harmony.properties")
    if (file.isFile) file.inputStream().use { load(it) }
}

fun setting(name: String, fallback: String): String =
    exportedApp.getProperty(name) ?: providers.gradleProperty(name).getOrElse(fallback)

android {
    namespace = "org.harmonymobile.demo"
    compileSdk = 35

    defaultConfig {
        applicationId = "org.harmonymobile.demo"
        // API 33: the platform providers' X25519 (KeyAgreement/KeyPairGenerator "XDH") that sealing needs.
        // The manifest is checked with ECDSA P-256 (SHA256withECDSA, on every API level), not Ed25519.
        minSdk = 33
        targetSdk = 35
        versionCode = 1
        versionName = "0.1.0"
        buildConfigField("String", "PINNED_MANIFEST_KEY", quoted(setting("harmony.pinnedManifestKey", "")))
        buildConfigField("String", "DEFAULT_SERVER_URL", quoted(setting("harmony.serverUrl", "http://10.0.2.2:8000")))
        // Where newer exports' artifacts are published (an update's manifest comes from the server);
        // empty: the server itself, GET <server URL>/v1/artifacts/<path> with the device token.
        buildConfigField("String", "ARTIFACT_BASE_URL", quoted(setting("harmony.artifactBaseUrl", "")))
        ndk {
            // ExecuTorch ships arm64-v8a and x86_64 (emulator) native libraries.
            abiFilters += listOf("arm64-v8a", "x86_64")
        }
    }

    buildFeatures {
        buildConfig = true
        viewBinding = true
    }

    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }

    androidResources {
        // .pte files are memory-mapped after being copied out; keep them uncompressed in the APK.
        noCompress += "pte"
    }
}

// `kotlinOptions` inside `android {}` is an error from Kotlin 2.2; the compilerOptions DSL replaces it.
kotlin {
    compilerOptions {
        jvmTarget.set(org.jetbrains.kotlin.gradle.dsl.JvmTarget.JVM_17)
    }
}

dependencies {
    implementation(project(":harmony-core"))

    implementation("org.pytorch:executorch-android:$executorchVersion")
    // Declared explicitly because a locally built AAR (libs/executorch.aar) does not bring them.
    implementation("com.facebook.fbjni:fbjni:0.7.0")
    implementation("com.facebook.soloader:soloader:0.10.5")

    implementation("androidx.core:core-ktx:1.15.0")
    implementation("androidx.appcompat:appcompat:1.7.0")
    implementation("androidx.activity:activity-ktx:1.10.1")
    implementation("androidx.lifecycle:lifecycle-runtime-ktx:2.8.7")
    implementation("androidx.lifecycle:lifecycle-viewmodel-ktx:2.8.7")
    implementation("com.google.android.material:material:1.12.0")
    implementation("org.jetbrains.kotlinx:kotlinx-coroutines-android:1.10.1")
}
