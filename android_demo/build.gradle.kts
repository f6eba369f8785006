// Plugin versions for the whole project (AGP 8.9 needs Gradle >= 8.11; see gradle/wrapper).
plugins {
    id("com.android.application") version "8.9.1" apply false
    id("org.jetbrains.kotlin.android") version "2.1.20" apply false
}
