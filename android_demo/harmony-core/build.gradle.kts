// Gradle view of harmony-core for the Android build. The source of truth for building and testing it
// on a JVM is pom.xml (`mvn -o test`); this file only lets :app depend on the same sources.
plugins {
    `java-library`
}

java {
    sourceCompatibility = JavaVersion.VERSION_17
    targetCompatibility = JavaVersion.VERSION_17
}

dependencies {
    testImplementation(platform("org.junit:junit-bom:5.10.2"))
    testImplementation("org.junit.jupiter:junit-jupiter")
    // Gradle 9 no longer puts a JUnit Platform launcher on the test runtime classpath by itself.
    testRuntimeOnly("org.junit.platform:junit-platform-launcher")
}

tasks.test {
    useJUnitPlatform()
    systemProperty("harmony.vectors.dir", rootProject.file("../tests/vectors").absolutePath)
}
