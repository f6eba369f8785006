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
    testImplementation("org.junit.jupiter:junit-jupiter:5.10.2")
}

tasks.test {
    useJUnitPlatform()
    systemProperty("harmony.vectors.dir", rootProject.file("../tests/vectors").absolutePath)
}
