// Android Studio / Gradle project of the harmony-mobile demo app.
// :harmony-core is the same plain-Java library that builds and tests offline with Maven here (pom.xml);
// Gradle compiles it from the same sources through harmony-core/build.gradle.kts.
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}

dependencyResolutionManagement {
    repositoriesMode.set(RepositoriesMode.FAIL_ON_PROJECT_REPOS)
    repositories {
        google()
        mavenCentral()
    }
}

rootProject.name = "harmony-android-demo"
include(":app", ":harmony-core")
